//! keepalived.conf to Sluice TOML (`sluicectl import-keepalived FILE`): the
//! `virtual_server` and `real_server` blocks become `[[services]]` and
//! `[[services.real_servers]]` with their health checks, the first `vrrp_instance`
//! becomes `[vrrp]`. What has no Sluice equivalent is listed, with its line, rather
//! than guessed at.
//!
//! The reader follows keepalived's syntax: a statement per line, `{` opens a block
//! (at the end of its line or alone on the next), `}` closes it, `!` and `#` start a
//! comment, `"..."` quotes a word. Any text gives an answer: a result, or an error
//! naming the line (an unbalanced brace, nesting deeper than keepalived's configs go).
use crate::model::SchedulerKind;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

/// How deep blocks may nest (keepalived's deepest, `virtual_server` > `real_server`
/// > `HTTP_GET` > `url`, is four).
const MAX_DEPTH: usize = 16;

/// keepalived's defaults: `delay_loop` 60 s, `connect_timeout` 5 s, `retry` 1 for
/// the TCP and HTTP checkers.
const DEFAULT_DELAY_LOOP_S: f64 = 60.0;
const DEFAULT_CONNECT_TIMEOUT_S: f64 = 5.0;
const DEFAULT_RETRY: u32 = 1;

/// One statement: its words, the line it starts on, and its block if it has one.
#[derive(Clone, Debug, PartialEq)]
struct Node {
    words: Vec<String>,
    line: usize,
    block: Option<Vec<Node>>,
}

impl Node {
    fn keyword(&self) -> &str {
        self.words.first().map_or("", String::as_str)
    }

    fn arg(&self, i: usize) -> Option<&str> {
        self.words.get(i).map(String::as_str)
    }

    fn children(&self) -> &[Node] {
        self.block.as_deref().unwrap_or(&[])
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Word(String),
    Open,
    Close,
    Newline,
}

fn tokenize(text: &str) -> Vec<(Token, usize)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        let mut chars = line.chars().peekable();
        while let Some(&c) = chars.peek() {
            match c {
                '!' | '#' => break,
                '{' => {
                    chars.next();
                    out.push((Token::Open, line_no));
                }
                '}' => {
                    chars.next();
                    out.push((Token::Close, line_no));
                }
                c if c.is_whitespace() => {
                    chars.next();
                }
                '"' => {
                    chars.next();
                    let mut word = String::new();
                    for c in chars.by_ref() {
                        if c == '"' {
                            break;
                        }
                        word.push(c);
                    }
                    out.push((Token::Word(word), line_no));
                }
                _ => {
                    let mut word = String::new();
                    while let Some(&c) = chars.peek() {
                        if c.is_whitespace() || "{}!#\"".contains(c) {
                            break;
                        }
                        word.push(c);
                        chars.next();
                    }
                    out.push((Token::Word(word), line_no));
                }
            }
        }
        out.push((Token::Newline, line_no));
    }
    out
}

/// The statements of a block (or of the file at depth 0), up to its `}`.
fn parse_block(
    tokens: &[(Token, usize)],
    pos: &mut usize,
    depth: usize,
    opened_at: usize,
) -> Result<Vec<Node>, String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "line {opened_at}: blocks nest deeper than {MAX_DEPTH}"
        ));
    }
    let mut nodes: Vec<Node> = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut line = 0;
    while let Some((token, at)) = tokens.get(*pos) {
        *pos += 1;
        match token {
            Token::Word(w) => {
                if words.is_empty() {
                    line = *at;
                }
                words.push(w.clone());
            }
            Token::Newline => {
                if !words.is_empty() {
                    nodes.push(Node {
                        words: std::mem::take(&mut words),
                        line,
                        block: None,
                    });
                }
            }
            Token::Open => {
                let block = parse_block(tokens, pos, depth + 1, *at)?;
                if words.is_empty() {
                    // `{` alone on its line opens the previous statement's block.
                    match nodes.last_mut() {
                        Some(node) if node.block.is_none() => node.block = Some(block),
                        _ => return Err(format!("line {at}: a block without a name")),
                    }
                } else {
                    nodes.push(Node {
                        words: std::mem::take(&mut words),
                        line,
                        block: Some(block),
                    });
                }
            }
            Token::Close => {
                if depth == 0 {
                    return Err(format!("line {at}: '}}' closes no block"));
                }
                if !words.is_empty() {
                    nodes.push(Node {
                        words: std::mem::take(&mut words),
                        line,
                        block: None,
                    });
                }
                return Ok(nodes);
            }
        }
    }
    if depth > 0 {
        return Err(format!("line {opened_at}: this block is never closed"));
    }
    Ok(nodes)
}

/// What an import gives: the TOML text and what could not be translated, one line
/// each, `LINE: WHAT: WHY`, in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Import {
    pub toml: String,
    pub untranslated: Vec<(usize, String)>,
}

/// Translates keepalived.conf `text` (named `source` in the TOML's header). An error
/// only when the text is not keepalived's syntax (an unbalanced brace).
pub fn import(text: &str, source: &str) -> Result<Import, String> {
    let tokens = tokenize(text);
    let mut pos = 0;
    let nodes = parse_block(&tokens, &mut pos, 0, 0)?;
    let mut out = Translation::default();
    let mut vrrp_done = false;
    for node in &nodes {
        match node.keyword() {
            "virtual_server" => out.virtual_server(node),
            "vrrp_instance" if !vrrp_done => {
                vrrp_done = true;
                out.vrrp_instance(node);
            }
            "vrrp_instance" => out.skip(
                node,
                "Sluice runs one VRRP instance ([vrrp]); the first one was translated",
            ),
            // Notification and identity settings: nothing a load balancer's table
            // needs.
            "global_defs" => out.skip(
                node,
                "global settings (mail, router id) have no Sluice equivalent",
            ),
            "virtual_server_group" => out.skip(
                node,
                "Sluice has no service groups: write each address and port as a virtual_server",
            ),
            "vrrp_sync_group" => out.skip(node, "Sluice runs one VRRP instance: no sync groups"),
            "vrrp_script" | "vrrp_track_process" | "vrrp_track_file" => {
                out.skip(node, "Sluice's VRRP tracks no scripts, processes or files")
            }
            "static_ipaddress" | "static_routes" | "static_rules" => {
                out.skip(node, "Sluice manages no kernel addresses, routes or rules")
            }
            "include" => out.skip(node, "included files are not read: import each one"),
            _ => out.skip(node, "not translated"),
        }
    }
    let mut toml = format!(
        "# Sluice services{} from keepalived.conf {} (sluicectl import-keepalived).\n\
         # Add [lcores] and [[ports]] (docs/CONFIG.md). What could not be translated\n\
         # was listed on stderr.\n",
        if vrrp_done { " and VRRP" } else { "" },
        quote(source)
    );
    toml += &out.vrrp;
    toml += &out.services;
    out.untranslated.sort_by_key(|(line, _)| *line);
    Ok(Import {
        toml,
        untranslated: out.untranslated,
    })
}

#[derive(Default)]
struct Translation {
    vrrp: String,
    services: String,
    vips: Vec<IpAddr>,
    untranslated: Vec<(usize, String)>,
}

/// A TOML basic string.
fn quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A number of seconds as keepalived reads it (fractions allowed), in milliseconds.
fn seconds_ms(text: &str) -> Option<u64> {
    let s: f64 = text.parse().ok()?;
    (0.0..=1e9)
        .contains(&s)
        .then(|| (s * 1000.0).round() as u64)
}

/// The health check of one real server, as far as it is translated.
struct Check {
    kind: &'static str,
    port: Option<u16>,
    path: Option<String>,
    expect: Option<u16>,
    timeout_ms: u64,
    retry: u32,
}

impl Translation {
    fn note(&mut self, node: &Node, why: &str) {
        self.untranslated
            .push((node.line, format!("{}: {why}", node.words.join(" "))));
    }

    /// A statement (and its block) left out.
    fn skip(&mut self, node: &Node, why: &str) {
        self.note(node, why);
    }

    fn vrrp_instance(&mut self, node: &Node) {
        let mut vrid: Option<u8> = None;
        let mut priority: Option<u8> = None;
        let mut advert_ms: Option<u64> = None;
        let mut preempt = true;
        let mut addresses: Vec<Ipv4Addr> = Vec::new();
        let mut peers: Vec<Ipv4Addr> = Vec::new();
        let mut source: Option<Ipv4Addr> = None;
        for n in node.children() {
            match (n.keyword(), n.arg(1)) {
                ("virtual_router_id", Some(v)) => match v.parse::<u8>() {
                    Ok(id) if id >= 1 => vrid = Some(id),
                    _ => self.note(n, "not a router id (1..=255)"),
                },
                ("priority", Some(v)) => match v.parse::<u8>() {
                    Ok(p) if p >= 1 => priority = Some(p),
                    _ => self.note(n, "not a priority (1..=255)"),
                },
                ("advert_int", Some(v)) => match seconds_ms(v) {
                    Some(ms) if (10..=40_950).contains(&ms) && ms % 10 == 0 => {
                        advert_ms = Some(ms)
                    }
                    _ => self.note(
                        n,
                        "VRRPv3 advertises 0.01 to 40.95 s in hundredths: not translated",
                    ),
                },
                ("nopreempt", None) => preempt = false,
                ("virtual_ipaddress" | "virtual_ipaddress_excluded", _) => {
                    for a in n.children() {
                        let ip = a.keyword().split('/').next().unwrap_or("");
                        match ip.parse::<Ipv4Addr>() {
                            Ok(ip) => {
                                if a.words.len() > 1 {
                                    self.note(
                                        a,
                                        "only the address is kept: Sluice answers ARP for it on every port",
                                    );
                                }
                                addresses.push(ip)
                            }
                            Err(_) => self.note(a, "Sluice's VRRP moves IPv4 addresses only"),
                        }
                    }
                }
                ("state", _) => self.note(
                    n,
                    "the initial state is not kept: Sluice starts as backup and elects by priority",
                ),
                ("interface", _) => self.note(
                    n,
                    "Sluice advertises on its first DPDK port ([vrrp] source), not a kernel interface",
                ),
                ("authentication", _) => {
                    self.note(n, "VRRPv3 (RFC 5798) has no authentication")
                }
                ("unicast_src_ip", Some(v)) => match v.parse::<Ipv4Addr>() {
                    Ok(ip) => source = Some(ip),
                    Err(_) => self.note(n, "Sluice advertises from an IPv4 address"),
                },
                ("unicast_peer", _) => {
                    // [vrrp] peers with `unicast = true`: adverts to each of them, as
                    // keepalived sends them, and theirs the only ones that count.
                    for p in n.children() {
                        match p.keyword().parse::<Ipv4Addr>() {
                            Ok(ip) if !peers.contains(&ip) => peers.push(ip),
                            Ok(_) => {}
                            Err(_) => self.note(p, "Sluice's VRRP peers are IPv4 addresses"),
                        }
                    }
                }
                _ => self.note(n, "not translated"),
            }
        }
        let Some(vrid) = vrid else {
            self.note(node, "no virtual_router_id: no [vrrp] written");
            return;
        };
        let mut t = format!("\n[vrrp]\nvrid = {vrid}\n");
        if peers.is_empty() {
            // keepalived takes adverts from anyone on the link; so does the
            // translation, said out loud, since Sluice refuses it by default.
            self.note(
                node,
                "no unicast_peer: written as `any_peer = true` (adverts from any sender on \
                 the link count); list the other routers in [vrrp] peers instead",
            );
            t += "any_peer = true\n";
        } else {
            let list: Vec<String> = peers.iter().map(|a| quote(&a.to_string())).collect();
            let _ = writeln!(t, "peers = [{}]\nunicast = true", list.join(", "));
        }
        // keepalived cannot seal VRRPv3 adverts with Sluice's trailer, so a group it is
        // in runs unauthenticated, said out loud; a group of Sluice nodes sets `key`.
        self.note(
            node,
            "written with `unauthenticated = true`: keepalived's VRRPv3 adverts carry no \
             authentication; once every router of the group is Sluice, set the same `key` \
             on each instead",
        );
        t += "unauthenticated = true\n";
        if let Some(ip) = source {
            let _ = writeln!(t, "source = {}", quote(&ip.to_string()));
        }
        if let Some(p) = priority {
            let _ = writeln!(t, "priority = {p}");
        }
        if let Some(ms) = advert_ms {
            let _ = writeln!(t, "advert_interval_ms = {ms}");
        }
        if !preempt {
            t += "preempt = false\n";
        }
        // The virtual services' addresses move anyway; the rest are listed.
        self.vrrp = t;
        self.vrrp_addresses(addresses);
    }

    fn vrrp_addresses(&mut self, addresses: Vec<Ipv4Addr>) {
        let mut seen: Vec<Ipv4Addr> = Vec::new();
        for a in addresses {
            if !seen.contains(&a) {
                seen.push(a);
            }
        }
        if !seen.is_empty() {
            let list: Vec<String> = seen.iter().map(|a| quote(&a.to_string())).collect();
            let _ = writeln!(self.vrrp, "addresses = [{}]", list.join(", "));
        }
    }

    fn virtual_server(&mut self, node: &Node) {
        let (Some(addr), Some(port)) = (node.arg(1), node.arg(2)) else {
            let why = match node.arg(1) {
                Some("fwmark") => {
                    "fwmark services: Sluice matches a service by protocol, address and port"
                }
                Some("group") => {
                    "Sluice has no service groups: write each address and port as a virtual_server"
                }
                _ => "expected virtual_server ADDRESS PORT",
            };
            self.skip(node, why);
            return;
        };
        let Ok(vip) = addr.parse::<IpAddr>() else {
            self.skip(node, "not an IP address");
            return;
        };
        let port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                self.skip(
                    node,
                    "Sluice services have a port (1..=65535): no all-ports services",
                );
                return;
            }
        };
        let mut proto = "tcp";
        let mut scheduler: Option<&'static str> = None;
        let mut mode = "nat";
        let mut persistence: Option<u32> = None;
        let mut netmask: Option<Ipv4Addr> = None;
        let mut prefix6: Option<u8> = None;
        let mut delay_loop_ms = (DEFAULT_DELAY_LOOP_S * 1000.0) as u64;
        let mut real_servers: Vec<&Node> = Vec::new();
        let mut sorry: Option<&Node> = None;
        let mut sorry_inhibit = false;
        let mut sorry_mode: Option<&'static str> = None;
        for n in node.children() {
            match (n.keyword(), n.arg(1)) {
                ("protocol", Some(p)) => match p.to_ascii_uppercase().as_str() {
                    "TCP" => proto = "tcp",
                    "UDP" => proto = "udp",
                    _ => {
                        self.note(
                            n,
                            "Sluice balances TCP and UDP: the service is not translated",
                        );
                        return;
                    }
                },
                ("lb_algo" | "lvs_sched", Some(a)) => match a.parse::<SchedulerKind>() {
                    Ok(k) => scheduler = Some(k.name()),
                    Err(_) => self.note(n, "Sluice has no such scheduler: wlc is used"),
                },
                // keepalived's default forwarding method is NAT.
                ("lb_kind" | "lvs_method", Some(k)) => match k.to_ascii_uppercase().as_str() {
                    "NAT" => mode = "nat",
                    "DR" => mode = "dr",
                    "TUN" => mode = "tun",
                    _ => self.note(n, "not NAT, DR or TUN: nat is used"),
                },
                ("persistence_timeout", v) => {
                    // keepalived's default without a value is 6 minutes.
                    match v.map_or(Some(360), |v| v.parse::<u32>().ok()) {
                        Some(t) if (1..=2_678_400).contains(&t) => persistence = Some(t),
                        _ => self.note(n, "not a timeout of 1..=2678400 s"),
                    }
                }
                // keepalived reads an IPv6 service's granularity as a prefix length
                // (1..=128), an IPv4 one's as a netmask.
                ("persistence_granularity", Some(m)) if vip.is_ipv6() => match m.parse::<u8>() {
                    Ok(len @ 1..=128) => prefix6 = Some(len),
                    _ => self.note(n, "not an IPv6 prefix length of 1..=128"),
                },
                ("persistence_granularity", Some(m)) => match m.parse::<Ipv4Addr>() {
                    Ok(m) if u32::from(m).leading_ones() + u32::from(m).trailing_zeros() == 32 => {
                        netmask = Some(m)
                    }
                    _ => self.note(n, "not a contiguous IPv4 netmask"),
                },
                ("delay_loop", Some(v)) => match seconds_ms(v) {
                    Some(ms) if (10..=3_600_000).contains(&ms) => delay_loop_ms = ms,
                    _ => self.note(n, "Sluice checks every 0.01 to 3600 s: 60 s is used"),
                },
                ("real_server", _) => real_servers.push(n),
                ("sorry_server", _) => sorry = Some(n),
                ("sorry_server_inhibit", None) => sorry_inhibit = true,
                ("sorry_server_lvs_method", Some(k)) => match k.to_ascii_uppercase().as_str() {
                    "NAT" => sorry_mode = Some("nat"),
                    "DR" => sorry_mode = Some("dr"),
                    "TUN" => sorry_mode = Some("tun"),
                    _ => self.note(n, "not NAT, DR or TUN: the service's lb_kind is used"),
                },
                ("ha_suspend", None) => {
                    self.note(n, "Sluice checks real servers whatever its VRRP state")
                }
                ("quorum" | "quorum_up" | "quorum_down" | "hysteresis", _) => {
                    self.note(n, "Sluice has no quorum")
                }
                ("persistence_engine", _) => self.note(n, "Sluice has no persistence engines"),
                ("ops", None) => self.note(n, "Sluice has no one-packet scheduling"),
                ("virtualhost", _) => {
                    self.note(n, "Sluice's HTTP check sends no Host header (HTTP/1.0)")
                }
                _ => self.note(n, "not translated"),
            }
        }
        self.vips.push(vip);
        let mut t = format!(
            "\n[[services]]\nproto = \"{proto}\"\nvip = {}\nport = {port}\n",
            quote(&vip.to_string())
        );
        if let Some(s) = scheduler {
            let _ = writeln!(t, "scheduler = \"{s}\"");
        }
        if let Some(p) = persistence {
            let _ = writeln!(t, "persistence_timeout = {p}");
            if let Some(m) = netmask.filter(|m| *m != Ipv4Addr::BROADCAST) {
                let _ = writeln!(t, "persistence_netmask = {}", quote(&m.to_string()));
            }
            // 128, one template per client address, is Sluice's default too.
            if let Some(len) = prefix6.filter(|len| *len != 128) {
                let _ = writeln!(t, "persistence_netmask = {len}");
            }
        }
        let mut seen: Vec<(IpAddr, u16)> = Vec::new();
        let mut servers = String::new();
        for rs in real_servers {
            if let Some(text) = self.real_server(rs, (vip, port), proto, mode, delay_loop_ms, &seen)
            {
                servers += &text.0;
                seen.push(text.1);
            }
        }
        if let Some(n) = sorry {
            let mode = sorry_mode.unwrap_or(mode);
            if let Some((ip, p)) = self.sorry_server(n, vip, port, mode, &seen) {
                let inhibit = if sorry_inhibit {
                    ", inhibit = true"
                } else {
                    ""
                };
                let _ = writeln!(
                    t,
                    "sorry_server = {{ ip = {}, port = {p}, mode = \"{mode}\"{inhibit} }}",
                    quote(&ip.to_string())
                );
            }
        }
        t += &servers;
        self.services += &t;
    }

    /// `sorry_server IP [PORT]`: its address and port, or `None` (noted).
    fn sorry_server(
        &mut self,
        node: &Node,
        vip: IpAddr,
        service_port: u16,
        mode: &str,
        seen: &[(IpAddr, u16)],
    ) -> Option<(IpAddr, u16)> {
        let Some(Ok(ip)) = node.arg(1).map(str::parse::<IpAddr>) else {
            self.skip(node, "not an IP address: not translated");
            return None;
        };
        if ip.is_ipv6() != vip.is_ipv6() {
            self.skip(node, "not of the service's address family: not translated");
            return None;
        }
        let mut port = match node.arg(2).map(str::parse::<u16>) {
            None | Some(Ok(0)) => service_port,
            Some(Ok(p)) => p,
            Some(Err(_)) => {
                self.skip(node, "not a port (1..=65535): not translated");
                return None;
            }
        };
        if port != service_port && matches!(mode, "dr" | "tun") {
            self.note(
                node,
                "dr and tun deliver to the service's port (as IPVS): the service's port is used",
            );
            port = service_port;
        }
        if seen.contains(&(ip, port)) {
            self.skip(
                node,
                "the sorry server is also a real server: Sluice keeps them apart, it is not translated",
            );
            return None;
        }
        Some((ip, port))
    }

    fn real_server(
        &mut self,
        node: &Node,
        (vip, service_port): (IpAddr, u16),
        proto: &str,
        mode: &str,
        delay_loop_ms: u64,
        seen: &[(IpAddr, u16)],
    ) -> Option<(String, (IpAddr, u16))> {
        let Some(Ok(ip)) = node.arg(1).map(str::parse::<IpAddr>) else {
            self.skip(node, "not an IP address: not translated");
            return None;
        };
        if ip.is_ipv6() != vip.is_ipv6() {
            self.skip(
                node,
                "not of the service's address family (only fullnat, not translated here, mixes them): not translated",
            );
            return None;
        }
        let mut port = match node.arg(2).map(str::parse::<u16>) {
            None => service_port,
            Some(Ok(p)) if p > 0 => p,
            Some(_) => {
                self.skip(node, "not a port (1..=65535): not translated");
                return None;
            }
        };
        if port != service_port && matches!(mode, "dr" | "tun") {
            self.note(
                node,
                "dr and tun deliver to the service's port (as IPVS): the service's port is used",
            );
            port = service_port;
        }
        if seen.contains(&(ip, port)) {
            self.skip(node, "the same real server twice: the first one is kept");
            return None;
        }
        let mut weight: Option<u32> = None;
        let mut check: Option<Check> = None;
        let mut interval_ms = delay_loop_ms;
        let mut upper: Option<u32> = None;
        let mut lower: Option<u32> = None;
        for n in node.children() {
            match (n.keyword(), n.arg(1)) {
                ("weight", Some(w)) => match w.parse::<u32>() {
                    Ok(w) if w <= 65_535 => weight = Some(w),
                    _ => self.note(n, "not a weight (0..=65535): 1 is used"),
                },
                // Sluice's eviction is keepalived's inhibit: the server stays, with no
                // new connections, and its established ones go on; without it keepalived
                // removes the server, which IPVS also lets finish its connections.
                ("inhibit_on_failure", None) => {}
                ("uthreshold", Some(v)) => match v.parse() {
                    Ok(v) => upper = Some(v),
                    Err(_) => self.note(n, "not a connection count"),
                },
                ("lthreshold", Some(v)) => match v.parse() {
                    Ok(v) => lower = Some(v),
                    Err(_) => self.note(n, "not a connection count"),
                },
                ("delay_loop", Some(v)) => match seconds_ms(v) {
                    Some(ms) if (10..=3_600_000).contains(&ms) => interval_ms = ms,
                    _ => self.note(n, "Sluice checks every 0.01 to 3600 s: not translated"),
                },
                ("TCP_CHECK" | "HTTP_GET" | "SSL_GET", _) if check.is_some() => self.note(
                    n,
                    "Sluice runs one check per real server: the first is kept",
                ),
                ("TCP_CHECK", _) => check = Some(self.checker(n, "tcp")),
                ("HTTP_GET", _) => check = Some(self.checker(n, "http")),
                ("SSL_GET", _) => {
                    self.note(
                        n,
                        "Sluice's probes speak no TLS: checked with a TCP handshake only (url, status_code and digest are not checked)",
                    );
                    check = Some(self.checker(n, "tcp"));
                }
                (
                    "MISC_CHECK" | "SMTP_CHECK" | "DNS_CHECK" | "UDP_CHECK" | "PING_CHECK"
                    | "FILE_CHECK" | "BFD_CHECK",
                    _,
                ) => self.note(n, "Sluice checks with TCP handshakes and HTTP only"),
                ("notify_up" | "notify_down", _) => {
                    self.note(n, "Sluice runs no scripts: it logs lb=evict and lb=restore")
                }
                _ => self.note(n, "not translated"),
            }
        }
        let mut t = format!(
            "\n  [[services.real_servers]]\n  ip = {}\n  port = {port}\n",
            quote(&ip.to_string())
        );
        if let Some(w) = weight {
            let _ = writeln!(t, "  weight = {w}");
        }
        let _ = writeln!(t, "  mode = \"{mode}\"");
        match (upper, lower) {
            (Some(u), l) if l.unwrap_or(0) <= u => {
                let _ = writeln!(t, "  upper = {u}");
                if let Some(l) = l {
                    let _ = writeln!(t, "  lower = {l}");
                }
            }
            (None, None) => {}
            _ => self.note(
                node,
                "lthreshold without a uthreshold above it: not translated",
            ),
        }
        if let Some(c) = check {
            let _ = write!(
                t,
                "\n    [services.real_servers.health]\n    check = \"{}\"\n",
                c.kind
            );
            // A UDP service's real servers are probed only with an explicit TCP port.
            match c.port {
                Some(p) => {
                    let _ = writeln!(t, "    port = {p}");
                }
                None if proto == "udp" => {
                    let _ = writeln!(t, "    port = {port}");
                }
                None => {}
            }
            if let Some(path) = &c.path {
                let _ = writeln!(t, "    path = {}", quote(path));
            }
            if let Some(e) = c.expect {
                let _ = writeln!(t, "    expect = {e}");
            }
            let timeout_ms = c.timeout_ms.clamp(1, interval_ms);
            if timeout_ms != c.timeout_ms {
                self.note(
                    node,
                    "the check's connect_timeout is longer than its delay_loop: Sluice's timeout is at most the interval, which is used",
                );
            }
            let _ = writeln!(t, "    interval_ms = {interval_ms}");
            let _ = writeln!(t, "    timeout_ms = {timeout_ms}");
            // keepalived takes a server out after its first failure and `retry` more.
            let _ = writeln!(t, "    fall = {}", (c.retry + 1).min(1000));
        }
        Some((t, (ip, port)))
    }

    /// TCP_CHECK, HTTP_GET or SSL_GET's settings.
    fn checker(&mut self, node: &Node, kind: &'static str) -> Check {
        let mut c = Check {
            kind,
            port: None,
            path: None,
            expect: None,
            timeout_ms: (DEFAULT_CONNECT_TIMEOUT_S * 1000.0) as u64,
            retry: DEFAULT_RETRY,
        };
        let http = kind == "http";
        let mut urls = 0;
        for n in node.children() {
            match (n.keyword(), n.arg(1)) {
                ("connect_port", Some(p)) => match p.parse::<u16>() {
                    Ok(p) if p > 0 => c.port = Some(p),
                    _ => self.note(n, "not a port (1..=65535)"),
                },
                ("connect_timeout", Some(v)) => match seconds_ms(v) {
                    Some(ms) if (1..=3_600_000).contains(&ms) => c.timeout_ms = ms,
                    _ => self.note(n, "not a timeout of 0.001..=3600 s: 5 s is used"),
                },
                ("retry" | "nb_get_retry", Some(v)) => match v.parse::<u32>() {
                    Ok(r) => c.retry = r.min(999),
                    Err(_) => self.note(n, "not a count: 1 is used"),
                },
                ("delay_before_retry", _) => self.note(
                    n,
                    "Sluice probes at a fixed interval: a failed probe is retried after interval_ms",
                ),
                // SSL_GET's URLs: its note says they are not checked.
                ("url", _) if !http => {}
                ("url", _) if urls > 0 => {
                    self.note(n, "Sluice checks one URL per real server: the first is kept")
                }
                ("url", _) => {
                    urls += 1;
                    self.url(n, &mut c);
                }
                _ => self.note(n, "not translated"),
            }
        }
        if kind == "http" && c.path.is_none() {
            c.path = Some("/".into());
        }
        if kind == "http" && c.expect.is_none() {
            // keepalived accepts any 2xx without a status_code.
            c.expect = Some(200);
        }
        c
    }

    fn url(&mut self, node: &Node, c: &mut Check) {
        for n in node.children() {
            match (n.keyword(), n.arg(1)) {
                ("path", Some(p)) if p.starts_with('/') && p.len() <= 256 => {
                    c.path = Some(p.to_string())
                }
                ("path", _) => self.note(
                    n,
                    "Sluice's HTTP check takes a path of at most 256 bytes starting with /",
                ),
                ("status_code", Some(first)) => {
                    let code = first.split('-').next().and_then(|s| s.parse::<u16>().ok());
                    match code {
                        Some(code) if (100..=599).contains(&code) => {
                            c.expect = Some(code);
                            if n.words.len() > 2 || first.contains('-') {
                                self.note(
                                    n,
                                    &format!("Sluice's HTTP check expects one status code: {code} is used"),
                                );
                            }
                        }
                        _ => self.note(n, "not a status code (100..=599)"),
                    }
                }
                ("digest", _) => self.note(n, "Sluice's HTTP check reads the status line only"),
                _ => self.note(n, "not translated"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config around the import, for Sluice's own reader.
    const BASE: &str = "[lcores]\nmanagement = 0\nworkers = [1]\n\n[[ports]]\nname = \"lan0\"\n\
        loopback = true\nmac = \"02:00:00:00:00:01\"\naddresses = [\"198.18.0.1/24\"]\n\n\
        [loopback]\npeers = 1\n";

    fn loads(toml: &str) {
        let text = format!("{BASE}{toml}");
        if let Err(e) = crate::config::Config::parse(&text, std::path::Path::new("import.toml")) {
            panic!("{e}\n{text}");
        }
    }

    #[test]
    fn a_service_with_checks_translates_and_loads() {
        let text = "\
! comment
virtual_server 10.1.1.1 80 {      # inline
    delay_loop 10
    lb_algo wrr
    lb_kind DR
    persistence_timeout 600
    persistence_granularity 255.255.255.0
    protocol TCP
    real_server 10.2.0.1 80 {
        weight 3
        TCP_CHECK {
            connect_port 8080
            connect_timeout 2
            retry 2
        }
    }
    real_server 10.2.0.2 80
    {
        weight 0
        HTTP_GET {
            url { path /health
                  status_code 204 }
        }
    }
}
";
        let import = import(text, "k.conf").unwrap();
        assert!(import.toml.contains(
            "[[services]]\nproto = \"tcp\"\nvip = \"10.1.1.1\"\nport = 80\nscheduler = \"wrr\"\n\
             persistence_timeout = 600\npersistence_netmask = \"255.255.255.0\"\n"
        ), "{}", import.toml);
        assert!(
            import.toml.contains(
                "  ip = \"10.2.0.1\"\n  port = 80\n  weight = 3\n  mode = \"dr\"\n\n    \
             [services.real_servers.health]\n    check = \"tcp\"\n    port = 8080\n    \
             interval_ms = 10000\n    timeout_ms = 2000\n    fall = 3\n"
            ),
            "{}",
            import.toml
        );
        assert!(
            import.toml.contains(
                "    check = \"http\"\n    path = \"/health\"\n    expect = 204\n    \
             interval_ms = 10000\n    timeout_ms = 5000\n    fall = 2\n"
            ),
            "{}",
            import.toml
        );
        assert_eq!(import.untranslated, vec![]);
        loads(&import.toml);
    }

    #[test]
    fn a_sorry_server_translates_with_its_inhibit_and_method() {
        let text = "\
virtual_server 10.1.1.1 80 {
    lb_kind DR
    sorry_server 10.2.0.9 80
    sorry_server_inhibit
    sorry_server_lvs_method TUN
    real_server 10.2.0.1 80 {
    }
}
virtual_server 10.1.1.2 80 {
    lb_kind NAT
    sorry_server 10.2.0.9
    real_server 10.2.0.9 80 {
    }
}
";
        let import = import(text, "k.conf").unwrap();
        assert!(
            import.toml.contains(
                "port = 80\nsorry_server = { ip = \"10.2.0.9\", port = 80, mode = \"tun\", inhibit = true }\n\n  [[services.real_servers]]\n  ip = \"10.2.0.1\"\n"
            ),
            "{}",
            import.toml
        );
        // The sorry server is also a real server: left out, and said.
        let lines: Vec<usize> = import.untranslated.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [11], "{:?}", import.untranslated);
        assert_eq!(import.toml.matches("sorry_server").count(), 1);
        loads(&import.toml);
    }

    #[test]
    fn vrrp_unicast_peers_are_kept_and_advertised_to_or_any_sender_is_let_in_out_loud() {
        let text = "\
vrrp_instance VI_1 {
    virtual_router_id 51
    unicast_src_ip 198.18.0.1
    unicast_peer {
        198.18.0.2
        198.18.0.3
        2001:db8::2
    }
}
";
        let import = import(text, "k.conf").unwrap();
        assert!(
            import.toml.contains(
                "[vrrp]\nvrid = 51\npeers = [\"198.18.0.2\", \"198.18.0.3\"]\nunicast = true\n\
                 unauthenticated = true\nsource = \"198.18.0.1\"\n"
            ),
            "{}",
            import.toml
        );
        // The IPv6 peer has no equivalent, and the instance runs unauthenticated.
        let lines: Vec<usize> = import.untranslated.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [1, 7], "{:?}", import.untranslated);
        assert!(import.untranslated[0].1.contains("unauthenticated = true"));
        loads(&import.toml);
        // Without unicast_peer keepalived hears anyone on the link: the translation
        // does too, in so many words, and says so.
        let open = super::import(
            "vrrp_instance VI_1 {\n    virtual_router_id 51\n}\n",
            "k.conf",
        )
        .unwrap();
        assert!(
            open.toml
                .contains("[vrrp]\nvrid = 51\nany_peer = true\nunauthenticated = true\n"),
            "{}",
            open.toml
        );
        assert_eq!(open.untranslated.len(), 2, "{:?}", open.untranslated);
        assert_eq!((open.untranslated[0].0, open.untranslated[1].0), (1, 1));
        assert!(open.untranslated[0].1.contains("any_peer = true"));
        loads(&open.toml);
    }

    #[test]
    fn what_has_no_equivalent_is_listed_by_line() {
        let text = "\
virtual_server fwmark 1 {
}
virtual_server 10.1.1.1 0 {
}
virtual_server 10.1.1.2 53 {
    protocol UDP
    lb_algo ovf
    quorum 2
    real_server 10.2.0.1 53 {
        MISC_CHECK {
            misc_path /bin/true
        }
    }
}
";
        let import = import(text, "k.conf").unwrap();
        let lines: Vec<usize> = import.untranslated.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [1, 3, 7, 8, 10], "{:?}", import.untranslated);
        assert!(import.untranslated[2].1.starts_with("lb_algo ovf: "));
        loads(&import.toml);
    }

    #[test]
    fn an_ipv6_service_keeps_its_persistence_and_prefix_length() {
        // keepalived writes an IPv6 service's granularity as a prefix length.
        let text = "\
virtual_server 2001:db8:18::10 443 {
    lb_algo rr
    persistence_timeout 300
    persistence_granularity 64
    real_server 2001:db8:18::20 443 {
    }
}
virtual_server 2001:db8:18::11 443 {
    persistence_timeout
    persistence_granularity 128
}
virtual_server 2001:db8:18::12 443 {
    persistence_timeout 60
    persistence_granularity 255.255.255.0
}
virtual_server 2001:db8:18::13 443 {
    persistence_timeout 60
    persistence_granularity 129
}
";
        let import = import(text, "k.conf").unwrap();
        let t = &import.toml;
        assert!(
            t.contains(
                "vip = \"2001:db8:18::10\"\nport = 443\nscheduler = \"rr\"\n\
                 persistence_timeout = 300\npersistence_netmask = 64\n"
            ),
            "{t}"
        );
        // 128 (one template per address) is Sluice's default: not written.
        assert!(
            t.contains("vip = \"2001:db8:18::11\"\nport = 443\npersistence_timeout = 360\n\n"),
            "{t}"
        );
        for vip in ["2001:db8:18::12", "2001:db8:18::13"] {
            let at = t.find(vip).unwrap();
            assert_eq!(
                t[at..].split("\n\n").next().unwrap().trim_end(),
                format!("{vip}\"\nport = 443\npersistence_timeout = 60"),
                "{t}"
            );
        }
        let lines: Vec<usize> = import.untranslated.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [14, 18], "{:?}", import.untranslated);
        assert!(import.untranslated[0].1.contains("prefix length"));
        let text = format!(
            "{}{t}",
            BASE.replace(
                "\"198.18.0.1/24\"]",
                "\"198.18.0.1/24\", \"2001:db8:18::1/64\"]"
            )
        );
        if let Err(e) = crate::config::Config::parse(&text, std::path::Path::new("import.toml")) {
            panic!("{e}\n{text}");
        }
    }

    #[test]
    fn bad_syntax_is_an_error_naming_the_line() {
        assert_eq!(
            import("virtual_server 1.2.3.4 80 {\n  lb_algo rr\n", "x").unwrap_err(),
            "line 1: this block is never closed"
        );
        assert_eq!(
            import("}\n", "x").unwrap_err(),
            "line 1: '}' closes no block"
        );
        let deep = "a {\n".repeat(100);
        assert!(import(&deep, "x").unwrap_err().contains("nest deeper"));
    }

    #[test]
    fn garbage_never_panics() {
        let pieces = [
            "{",
            "}",
            "\n",
            "virtual_server",
            "real_server",
            " 1.2.3.4",
            " 80",
            "\"",
            "!",
            "HTTP_GET",
            "url",
            "status_code",
            " -",
            " 99999999999",
            "vrrp_instance",
            "advert_int",
            " nan",
            " 1e308",
            "virtual_ipaddress",
            "\u{0}",
            "é",
        ];
        // A cheap deterministic generator: every input is a sequence of pieces.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..(seed % 40) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                text += pieces[(seed % pieces.len() as u64) as usize];
            }
            let _ = import(&text, "garbage");
        }
    }
}
