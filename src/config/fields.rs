//! One validation helper per kind of field. Each reads a `Field`, checks it, and
//! returns the typed value or an `Invalid` that names the field and says what is
//! wrong and what would be right.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use super::reader::{Check, Field};
use super::tree::Value;
use super::{ControlGroup, Ipv4Cidr, Ipv6Cidr};
use crate::model::ForwardMode;
use crate::model::Protocol;
use crate::model::SchedulerKind;

/// DPDK builds with RTE_MAX_LCORE = 128 on Debian: higher ids cannot be used.
pub(super) const MAX_LCORE: i64 = 127;
/// `sun_path` in `struct sockaddr_un` is 108 bytes including the terminating NUL.
const SUN_PATH_MAX: usize = 108;

/// An lcore id (0..=127).
pub(super) fn lcore_id(f: &Field) -> Check<u32> {
    f.int(0..=MAX_LCORE)
}

/// `--file-prefix`: DPDK turns it into file names under /var/run/dpdk and
/// /dev/hugepages, so it is kept to characters that are safe there.
pub(super) fn file_prefix(f: &Field) -> Check<String> {
    let s = f.str()?;
    let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if s.is_empty() || s.len() > 32 {
        return Err(f.invalid(format!("{s:?} must be 1..=32 characters long")));
    }
    match s.chars().find(|&c| !ok_char(c)) {
        Some(c) => Err(f.invalid(format!(
            "{s:?} contains {c:?}; only letters, digits, '_' and '-' are allowed"
        ))),
        None => Ok(s.to_string()),
    }
}

/// The control socket path: absolute (the daemon may chdir, and sluicectl must find
/// the same file) and short enough for `sockaddr_un`.
pub(super) fn socket_path(f: &Field) -> Check<PathBuf> {
    let s = f.str()?;
    if !s.starts_with('/') {
        return Err(f.invalid(format!("{s:?} is not an absolute path")));
    }
    if s.ends_with('/') {
        return Err(f.invalid(format!("{s:?} names a directory, not a socket file")));
    }
    if s.contains('\0') {
        return Err(f.invalid("contains a NUL byte"));
    }
    if s.len() >= SUN_PATH_MAX {
        return Err(f.invalid(format!(
            "path is {} bytes long; a Unix socket path must be shorter than {SUN_PATH_MAX}",
            s.len()
        )));
    }
    Ok(PathBuf::from(s))
}

/// `control.group`: a group name or a numeric gid, either of which must exist in the
/// system's group database.
pub(super) fn group(f: &Field) -> Check<ControlGroup> {
    let found = match f.node.value {
        Value::Int(_) => {
            let gid: u32 = f.int(0..=u32::MAX as i64 - 1)?;
            lookup_group(Lookup::Gid(gid)).map(|g| g.ok_or(format!("no group with gid {gid}")))
        }
        Value::Str(_) => {
            let name = f.str()?;
            if name.is_empty() || name.contains('\0') {
                return Err(f.invalid(format!("{name:?} is not a group name")));
            }
            lookup_group(Lookup::Name(name)).map(|g| g.ok_or(format!("no group named {name:?}")))
        }
        _ => {
            return Err(f.invalid(format!(
                "invalid type: {}, expected a group name or a gid",
                f.node.value.describe()
            )))
        }
    };
    match found {
        Ok(Ok(group)) => Ok(group),
        Ok(Err(missing)) => Err(f.invalid(format!("{missing} (see getent group)"))),
        Err(e) => Err(f.invalid(format!("looking up the group: {e}"))),
    }
}

enum Lookup<'a> {
    Name(&'a str),
    Gid(u32),
}

/// getgrnam_r / getgrgid_r: `Ok(None)` when the group does not exist.
fn lookup_group(key: Lookup) -> std::io::Result<Option<ControlGroup>> {
    let name = match key {
        Lookup::Name(n) => Some(std::ffi::CString::new(n).map_err(std::io::Error::other)?),
        Lookup::Gid(_) => None,
    };
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: all-zero is a valid `struct group` (null pointers, gid 0); it is
        // only read after the call filled it.
        let mut group: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call: `group` and `result` are
        // locals, `buf` is writable for `buf.len()` bytes, `name` is NUL-terminated.
        let rc = unsafe {
            match (&name, &key) {
                (Some(n), _) => libc::getgrnam_r(
                    n.as_ptr(),
                    &mut group,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut result,
                ),
                (None, Lookup::Gid(gid)) => libc::getgrgid_r(
                    *gid,
                    &mut group,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut result,
                ),
                (None, Lookup::Name(_)) => unreachable!("a name lookup has a CString"),
            }
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        // POSIX lets "not found" come back as one of these instead of 0 and NULL.
        if rc != 0 && ![libc::ENOENT, libc::ESRCH].contains(&rc) {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        if rc != 0 || result.is_null() {
            return Ok(None);
        }
        // SAFETY: on success `gr_name` points to a NUL-terminated string in `buf`,
        // which is still alive.
        let found = unsafe { std::ffi::CStr::from_ptr(group.gr_name) };
        return Ok(Some(ControlGroup {
            name: found.to_string_lossy().into_owned(),
            gid: group.gr_gid,
        }));
    }
}

/// A port name, as shown by sluicectl and used in logs: short, lowercase, no spaces
/// (15 characters is also what a Linux interface name allows).
pub(super) fn port_name(f: &Field) -> Check<String> {
    let s = f.str()?;
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
    if s.is_empty() || s.len() > 15 {
        return Err(f.invalid(format!("{s:?} must be 1..=15 characters long")));
    }
    match s.chars().find(|&c| !ok_char(c)) {
        Some(c) => Err(f.invalid(format!(
            "{s:?} contains {c:?}; only a-z, 0-9, '_' and '-' are allowed"
        ))),
        None => Ok(s.to_string()),
    }
}

/// A kernel network interface name: 1..=15 characters (IFNAMSIZ), letters, digits,
/// '_', '-' and '.', and not "." or "..". Nothing that would end a DPDK device
/// argument (',' or '=').
pub(super) fn interface_name(f: &Field) -> Check<String> {
    let s = f.str()?;
    if s.is_empty() || s.len() > 15 {
        return Err(f.invalid(format!(
            "{s:?} must be 1..=15 characters long (a Linux interface name)"
        )));
    }
    if s == "." || s == ".." {
        return Err(f.invalid(format!("{s:?} is not a valid interface name")));
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    match s.chars().find(|&c| !ok_char(c)) {
        Some(c) => Err(f.invalid(format!(
            "{s:?} contains {c:?}; only letters, digits, '_', '-' and '.' are allowed"
        ))),
        None => Ok(s.to_string()),
    }
}

/// A PCI address, `DDDD:BB:DD.F` or `BB:DD.F`, returned in the full lowercase form
/// DPDK uses as the device name (so the daemon can look the port up by it).
pub(super) fn pci_address(f: &Field) -> Check<String> {
    let s = f.str()?;
    parse_pci(s).ok_or_else(|| {
        f.invalid(format!(
            "{s:?} is not a PCI address (expected DDDD:BB:DD.F, e.g. \"0000:03:00.0\"; see `dpdk-devbind.py --status`)"
        ))
    })
}

fn parse_pci(s: &str) -> Option<String> {
    let (domain, bus_dev_fn) = match s.split(':').count() {
        3 => s.split_once(':')?,
        2 => ("0000", s),
        _ => return None,
    };
    let (bus, dev_fn) = bus_dev_fn.split_once(':')?;
    let (dev, func) = dev_fn.split_once('.')?;
    let domain = hex_exact(domain, 4)?;
    let bus = hex_exact(bus, 2)?;
    let dev = hex_exact(dev, 2).filter(|&d| d <= 0x1f)?;
    let func = hex_exact(func, 1).filter(|&f| f <= 7)?;
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func}"))
}

/// Exactly `len` hex digits.
fn hex_exact(s: &str, len: usize) -> Option<u32> {
    if s.len() != len || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

/// A DPDK virtual device spec, `net_<driver><n>[,key=value...]`. Only ethdev
/// drivers (`net_*`) make ports; anything else would leave the port missing.
pub(super) fn vdev_spec(f: &Field) -> Check<String> {
    let s = f.str()?;
    if !s.starts_with("net_") {
        return Err(f.invalid(format!(
            "{s:?} does not start with \"net_\" (expected an ethdev vdev such as \"net_af_packet0,iface=veth0\")"
        )));
    }
    let name = vdev_name(s);
    if name.len() == "net_".len() {
        return Err(f.invalid(format!("{s:?} has no driver name after \"net_\"")));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(f.invalid(format!(
            "{s:?}: device name {name:?} contains {c:?} (only letters, digits and '_')"
        )));
    }
    if let Some(c) = s.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(f.invalid(format!("{s:?} contains {c:?}")));
    }
    Ok(s.to_string())
}

/// The device name of a vdev spec: the part before the first ','.
pub(super) fn vdev_name(spec: &str) -> &str {
    spec.split(',').next().unwrap_or(spec)
}

/// A MAC override: six colon-separated hex octets, unicast and not all-zero (the
/// port's own address must be a valid source address).
pub(super) fn mac_address(f: &Field) -> Check<[u8; 6]> {
    let (s, mac) = mac_text(f)?;
    if mac[0] & 1 != 0 {
        return Err(f.invalid(format!(
            "{s:?} is a multicast address; a port needs a unicast MAC (first octet even)"
        )));
    }
    if mac == [0; 6] {
        return Err(f.invalid(format!("{s:?} is the all-zero address")));
    }
    Ok(mac)
}

/// A static neighbour's MAC: six colon-separated hex octets, unicast and not
/// all-zero (frames to it must reach one host).
pub(super) fn neighbour_mac(f: &Field) -> Check<[u8; 6]> {
    let (s, mac) = mac_text(f)?;
    if mac[0] & 1 != 0 || mac == [0; 6] {
        return Err(f.invalid(format!(
            "{s:?} is not a unicast MAC address: frames to a neighbour must reach one host"
        )));
    }
    Ok(mac)
}

/// A field holding six colon-separated hex octets: its text and the address.
fn mac_text<'a>(f: &Field<'a>) -> Check<(&'a str, [u8; 6])> {
    let s = f.str()?;
    let mac = parse_mac(s).ok_or_else(|| {
        f.invalid(format!(
            "{s:?} is not a MAC address (expected six hex octets, e.g. \"02:00:00:00:00:01\")"
        ))
    })?;
    Ok((s, mac))
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for octet in mac.iter_mut() {
        *octet = u8::try_from(hex_exact(parts.next()?, 2)?).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// One of the appliance's own addresses on a port. It must be usable as a source
/// and answerable by ARP, so no special, multicast or subnet-edge addresses.
pub(super) fn port_address(f: &Field) -> Check<Ipv4Cidr> {
    let s = f.str()?;
    let cidr: Ipv4Cidr = s.parse().map_err(|e| f.invalid(format!("{e}")))?;
    let addr = cidr.addr;
    let reject = |why: &str| Err(f.invalid(format!("{s:?}: {addr} {why}")));
    if addr.is_unspecified() {
        return reject("is the unspecified address");
    }
    if addr.is_multicast() {
        return reject("is a multicast address");
    }
    if addr == Ipv4Addr::BROADCAST {
        return reject("is the limited broadcast address");
    }
    // /31 (RFC 3021) and /32 have no network or broadcast address to avoid.
    if cidr.prefix_len <= 30 {
        if addr == cidr.network() {
            return reject(&format!("is the network address of {}", prefix_of(&cidr)));
        }
        if addr == cidr.broadcast() {
            return reject(&format!("is the broadcast address of {}", prefix_of(&cidr)));
        }
    }
    Ok(cidr)
}

/// One of the appliance's own IPv6 addresses on a port (an `addresses` entry with a
/// colon). It must be one unicast node's address that Neighbor Discovery can answer
/// for: no unspecified, loopback, multicast, IPv4-mapped or subnet-router anycast
/// address.
pub(super) fn port_address6(f: &Field) -> Check<Ipv6Cidr> {
    let s = f.str()?;
    let cidr: Ipv6Cidr = s.parse().map_err(|e: String| f.invalid(e))?;
    let addr = cidr.addr;
    let reject = |why: &str| Err(f.invalid(format!("{s:?}: {addr} {why}")));
    if addr.is_unspecified() {
        return reject("is the unspecified address");
    }
    if addr.is_loopback() {
        return reject("is the loopback address");
    }
    if addr.is_multicast() {
        return reject("is a multicast address");
    }
    if addr.to_ipv4_mapped().is_some() {
        return reject("is an IPv4-mapped address; write the IPv4 address instead");
    }
    // /127 (RFC 6164) and /128 have no subnet-router anycast address to avoid.
    if cidr.prefix_len <= 126 && addr == cidr.network() {
        return reject(&format!(
            "is the subnet-router anycast address of {}/{}",
            cidr.network(),
            cidr.prefix_len
        ));
    }
    Ok(cidr)
}

fn prefix_of(cidr: &Ipv4Cidr) -> String {
    format!("{}/{}", cidr.network(), cidr.prefix_len)
}

/// RX/TX ring size: PMDs want a power of two, and 64..=4096 is what the common NICs
/// (and every vdev) accept.
pub(super) fn desc_count(f: &Field) -> Check<u16> {
    let n: u16 = f.int(64..=4096)?;
    if !n.is_power_of_two() {
        return Err(f.invalid(format!("{n} is not a power of two (64..=4096)")));
    }
    Ok(n)
}

/// A Toeplitz RSS key in hex: 40 bytes (Intel) or 52 bytes (Mellanox, newer Intel).
/// Sluice computes the same hash in software, so the key must be exactly right.
pub(super) fn rss_key(f: &Field) -> Check<Vec<u8>> {
    let s = f.str()?;
    if let Some((i, c)) = s.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
        return Err(f.invalid(format!(
            "not hex: {c:?} at position {i} (expected 80 or 104 hex digits)"
        )));
    }
    if s.len() != 80 && s.len() != 104 {
        return Err(f.invalid(format!(
            "{} hex digits; an RSS key is exactly 40 or 52 bytes (80 or 104 hex digits)",
            s.len()
        )));
    }
    // Every char is an ASCII hex digit, so byte-pair slicing is safe.
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| f.invalid(e.to_string())))
        .collect()
}

/// An L3 MTU: 68 is the IPv4 minimum, 9000 the usual jumbo frame.
pub(super) fn mtu(f: &Field) -> Check<u16> {
    f.int(68..=9000)
}

/// A session timeout in seconds. 2147483 s is the largest value IPVS accepts
/// (`ipvsadm --set`): `INT_MAX` jiffies at HZ=1000.
pub(super) fn timeout_s(f: &Field) -> Check<u32> {
    f.int(1..=2_147_483)
}

/// Sessions per worker. Any count in range is fine: the table rounds its buckets
/// up itself.
pub(super) fn session_capacity(f: &Field) -> Check<u32> {
    f.int(1024..=67_108_864)
}

/// The session timer-wheel tick. Below 10 ms the wheel costs more than it buys;
/// above 1 s the shortest timeouts (`close` = 10 s) lose their precision.
pub(super) fn tick_ms(f: &Field) -> Check<u32> {
    f.int(10..=1000)
}

/// An idle worker's sleep in microseconds: 0 never sleeps; above a millisecond a
/// quiet worker would answer its first packet too late for any use.
pub(super) fn idle_sleep_us(f: &Field) -> Check<u32> {
    f.int(0..=1000)
}

/// Neighbour entries per worker and family: at least 256 (real servers, gateways and
/// peers of a small site), at most 1Mi (2Mi slots of 40 and 48 bytes: 176 MiB a
/// worker for both tables).
pub(super) fn neighbour_capacity(f: &Field) -> Check<u32> {
    f.int(256..=1 << 20)
}

/// Persistence templates the appliance keeps (IPv4; an eighth as many IPv6 ones):
/// one bucket of four at least, 16 Mi at most (512 MiB, and 128 MiB of IPv6 ones).
pub(super) fn persistence_templates(f: &Field) -> Check<u32> {
    f.int(4..=1 << 24)
}

/// A FullNAT local port bound (port 0 is never handed out).
pub(super) fn local_port(f: &Field) -> Check<u16> {
    f.int(1..=65535)
}

/// The real servers' TIME-WAIT in seconds: Linux's is 60, other systems' up to 240
/// (2 MSL of 120 s); an hour is far beyond any.
pub(super) fn server_time_wait_s(f: &Field) -> Check<u32> {
    f.int(1..=3600)
}

/// A service's protocol: "tcp" or "udp" (lowercase, as ipvsadm's -t / -u).
pub(super) fn protocol(f: &Field) -> Check<Protocol> {
    match f.str()? {
        "tcp" => Ok(Protocol::Tcp),
        "udp" => Ok(Protocol::Udp),
        s => Err(f.invalid(format!("unknown protocol {s:?} (known: tcp, udp)"))),
    }
}

/// A TCP or UDP port number (0 is not a port a client can connect to).
pub(super) fn l4_port(f: &Field) -> Check<u16> {
    f.int(1..=65535)
}

/// A plain IPv4 (dotted quad) or IPv6 address that can be a unicast destination: not
/// unspecified, multicast or 255.255.255.255. `what` names it in messages ("VIP").
fn unicast_ip(f: &Field, what: &str) -> Check<IpAddr> {
    let s = f.str()?;
    let ip: IpAddr = s.parse().map_err(|_| {
        f.invalid(format!(
            "{s:?} is not an IP address (expected a.b.c.d or an IPv6 address, without a prefix)"
        ))
    })?;
    let reject = |why: &str| Err(f.invalid(format!("{what} {ip} {why}")));
    if ip.is_unspecified() {
        return reject("is the unspecified address");
    }
    if ip.is_multicast() {
        return reject("is a multicast address");
    }
    if ip == Ipv4Addr::BROADCAST {
        return reject("is the limited broadcast address");
    }
    Ok(ip)
}

/// A service's virtual IP.
pub(super) fn vip(f: &Field) -> Check<IpAddr> {
    unicast_ip(f, "VIP")
}

/// A real server's address.
pub(super) fn real_server_ip(f: &Field) -> Check<IpAddr> {
    unicast_ip(f, "real server")
}

/// A FullNAT local address: the source of packets to real servers, so also not a
/// loopback address (a real server would never send a reply to it).
pub(super) fn local_address(f: &Field) -> Check<IpAddr> {
    let ip = unicast_ip(f, "local address")?;
    if ip.is_loopback() {
        return Err(f.invalid(format!("local address {ip} is a loopback address")));
    }
    Ok(ip)
}

/// A scheduler name, as `ipvsadm -s` takes it.
pub(super) fn scheduler(f: &Field) -> Check<SchedulerKind> {
    f.str()?.parse().map_err(|e: String| f.invalid(e))
}

/// A forwarding mode name: dr, nat, tun or fullnat.
pub(super) fn forward_mode(f: &Field) -> Check<ForwardMode> {
    f.str()?.parse().map_err(|e: String| f.invalid(e))
}

/// `ipvsadm -p`: up to 31 days, as IPVS allows.
pub(super) fn persistence_timeout(f: &Field) -> Check<u32> {
    f.int(1..=i64::from(crate::model::MAX_PERSISTENCE_TIMEOUT_S))
}

/// `ipvsadm -M`: a dotted-quad netmask whose one bits are contiguous from the top
/// (255.255.255.0, not 255.0.255.0). 0.0.0.0 is contiguous too: one real server
/// for every client.
pub(super) fn netmask(f: &Field) -> Check<Ipv4Addr> {
    let s = f.str()?;
    let mask: Ipv4Addr = s.parse().map_err(|_| {
        f.invalid(format!(
            "{s:?} is not a netmask (expected a.b.c.d, e.g. \"255.255.255.0\")"
        ))
    })?;
    let bits = u32::from(mask);
    if bits.leading_ones() + bits.trailing_zeros() != 32 {
        return Err(f.invalid(format!(
            "{s:?} is not a contiguous netmask (its one bits must all come first, e.g. \"255.255.255.0\")"
        )));
    }
    Ok(mask)
}

/// `ipvsadm -M` after an IPv6 service: a prefix length, 1..=128.
pub(super) fn prefix6(f: &Field) -> Check<u8> {
    match f.int(1..=128) {
        Ok(n) => Ok(n),
        Err(_) if f.str().is_ok() => Err(f.invalid(format!(
            "{:?} is an IPv6 service's prefix length: write an integer, 1..=128 (e.g. 64), \
             not a dotted netmask",
            f.str().unwrap_or_default()
        ))),
        Err(e) => Err(e),
    }
}

/// A real server's weight (`ipvsadm -w`): 0 drains it.
pub(super) fn weight(f: &Field) -> Check<u32> {
    f.int(0..=i64::from(crate::model::MAX_WEIGHT))
}

/// A connection threshold (`ipvsadm -x` / `-y`); 0 means none.
pub(super) fn conn_threshold(f: &Field) -> Check<u32> {
    f.int(0..=i64::from(crate::model::MAX_CONN_THRESHOLD))
}
