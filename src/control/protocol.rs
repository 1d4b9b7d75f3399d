//! The control wire protocol: line-delimited JSON over a Unix stream socket.
//!
//! A client writes one request object per line and reads exactly one response line per
//! request, in order; a connection may carry any number of requests. Requests are tagged
//! by `cmd`, so adding a command is adding one [`Request`] variant:
//!
//! ```text
//! -> {"cmd":"status"}
//! <- {"ok":true,"result":{...}}
//! -> {"cmd":"xstats","port":7}
//! <- {"ok":false,"error":"no port 7"}
//! ```
use crate::model::{Persistence, RealServerSpec, ServiceKey};
use crate::model::{SchedFlags, SchedulerKind};
use crate::service::{AclAction, Prefix, RateLimit};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::fmt;
use std::net::IpAddr;

/// The longest request line the server accepts, excluding the newline. Requests are
/// small commands; the cap bounds what a hostile client can make the daemon buffer.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The user and group of a control-socket peer, as the kernel reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requester {
    pub uid: u32,
    pub gid: u32,
}

/// One command sent to the daemon. Variants without fields take no arguments; unknown
/// fields are rejected so a misspelt argument never silently widens a command (for
/// example `zero_counters` with a stray `port` must not zero every port unnoticed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The whole-appliance status report ([`crate::control::report::StatusReport`]).
    Status,
    /// The NIC's extended statistics for one port
    /// ([`crate::control::report::XstatsReport`]).
    Xstats { port: u16 },
    /// Reset every port, lcore, drop and event counter to zero.
    ZeroCounters,
    /// `-Z -t|-u VIP:port`: zero one service's traffic counters (its real servers'
    /// connections, packets and bytes), as ipvsadm zeroes one service.
    ZeroService { service: ServiceKey },
    /// `-Z`: zero every service's counters (its real servers' connections, packets and
    /// bytes, its access list's hits), as ipvsadm zeroes all of IPVS's. Port, lcore,
    /// drop and event counters stay: they are the appliance's, not IPVS's, and
    /// monitoring reads them as counters that only grow ([`Request::ZeroCounters`]
    /// resets those too).
    ZeroServices,
    /// Virtual services with their real servers and counters (`ipvsadm -Ln`).
    ListServices,
    /// `-S`: the services listing with every service's access-list rules as well
    /// (`admission.allow`/`deny`), which the listing leaves out.
    SaveServices,
    /// `-A`: add a virtual service (scheduler defaults to wrr).
    AddService {
        service: ServiceKey,
        #[serde(default)]
        scheduler: Option<SchedulerKind>,
        #[serde(default)]
        persistence: Option<Persistence>,
        /// `-b sh-port,...`.
        #[serde(default)]
        sched_flags: Option<SchedFlags>,
    },
    /// `-E`: change a service's scheduler or persistence.
    EditService {
        service: ServiceKey,
        #[serde(default)]
        scheduler: Option<SchedulerKind>,
        #[serde(default)]
        persistence: Option<Persistence>,
        #[serde(default)]
        sched_flags: Option<SchedFlags>,
    },
    /// `-D`: delete a service; its sessions continue until they end, as in IPVS.
    DeleteService { service: ServiceKey },
    /// `-A/-E --synproxy`: the service's SYN proxy (NAT and FullNAT services only).
    SetSynproxy {
        service: ServiceKey,
        synproxy: crate::model::SynProxy,
    },
    /// A service's sorry server (its `sorry_server` in the config), or none.
    SetSorryServer {
        service: ServiceKey,
        #[serde(default)]
        sorry_server: Option<crate::model::SorryServerSpec>,
    },
    /// A service's `sloppy_tcp` (config only): sessions from any TCP segment but an RST.
    SetSloppyTcp { service: ServiceKey, on: bool },
    /// A service's Maglev lookup-table size (`mh_table_size`, config only).
    SetMhTableSize { service: ServiceKey, size: u32 },
    /// `-a`: add a real server to a service.
    AddServer {
        service: ServiceKey,
        server: RealServerSpec,
    },
    /// `-e`: change a real server's weight, mode or thresholds.
    EditServer {
        service: ServiceKey,
        server: RealServerSpec,
    },
    /// `-d`: remove a real server; its sessions continue until they end.
    DeleteServer {
        service: ServiceKey,
        ip: IpAddr,
        port: u16,
    },
    /// `-C`: delete every service.
    Clear,
    /// `--add-laddr` (DPVS): add a FullNAT local address to a service.
    AddLaddr { service: ServiceKey, ip: IpAddr },
    /// `--del-laddr` (DPVS): remove a local address; sessions using it continue until
    /// they end.
    DelLaddr { service: ServiceKey, ip: IpAddr },
    /// `--get-laddr` (DPVS): a service's local addresses, answered as
    /// `{"service": {...}, "local_addresses": ["a.b.c.d", ...]}`.
    GetLaddr { service: ServiceKey },
    /// `--acl-add`: access-list rules for a service (`action` allow or deny; a
    /// prefix already listed takes the new action). Only new connections are checked.
    AclAdd {
        service: ServiceKey,
        action: AclAction,
        prefixes: Vec<Prefix>,
    },
    /// `--acl-del`: removes rules; every prefix must be listed.
    AclDel {
        service: ServiceKey,
        prefixes: Vec<Prefix>,
    },
    /// Empties a service's access list (`--acl-load` sends it first, in one batch
    /// with the file's rules).
    AclClear { service: ServiceKey },
    /// `--acl-list`: the rules with their hits, the default and the rate limit
    /// ([`crate::control::report::AdmissionReport`]), at most `max` rules (all by
    /// default).
    AclList {
        service: ServiceKey,
        #[serde(default)]
        max: Option<u32>,
    },
    /// `--rate-limit`: a per-source new-connection rate limit, or none.
    SetRateLimit {
        service: ServiceKey,
        #[serde(default)]
        limit: Option<RateLimit>,
    },
    /// `-Lnc`: the workers' sessions ([`crate::control::report::ConnectionsReport`]),
    /// at most `max` of them (default [`DEFAULT_MAX_CONNECTIONS`]).
    ListConnections {
        #[serde(default)]
        max: Option<u32>,
        /// Page through the sessions: start here (`{"worker":0,"from":0}` for the
        /// first page) and answer at most `max` with the cursor of the next page in
        /// `next` (none after the last), so a listing of any size is read in bounded
        /// replies.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        page: Option<ConnectionsCursor>,
    },
    /// `--set tcp tcpfin udp`: session timeouts in seconds; 0 keeps a value.
    SetTimeouts { tcp: u32, tcpfin: u32, udp: u32 },
    /// `-L --timeout`: `{"tcp":s,"tcpfin":s,"udp":s}`.
    GetTimeouts,
    /// The services listing with rates over the last `window_s` seconds (1-60,
    /// default 2 as IPVS): `sluicectl skew --window`.
    ServiceRates {
        #[serde(default)]
        window_s: Option<u32>,
    },
    /// The Prometheus exposition text, as a JSON string (what `/metrics` serves).
    Metrics,
    /// Re-read the config file and apply the difference of its services (and
    /// timeouts) as one batch: `{"applied":N,"generation":G}`; a bad file changes
    /// nothing and names file, line and field.
    Reload,
    /// The recent config changes and alerts: `{"events":[{"unix_ms":N,"line":"lb=..."}]}`.
    Events,
    /// Health checking: every watched real server's check and verdict, and the
    /// monitor's probe counters (`health::HealthReport`).
    Health,
    /// VRRP: state, priority, the master last heard, counters (`daemon::vrrp`).
    Vrrp,
    /// Session sync: messages and records sent and received, rejections by reason.
    Sync,
    /// The workers' neighbour tables (ARP and Neighbor Discovery) and the real
    /// servers some worker has not resolved
    /// ([`crate::control::report::NeighboursReport`]).
    Neighbours,
    /// BGP through BIRD: the sessions, the VIPs announced and why any is withdrawn
    /// (`ha::bgp::ClusterReport`).
    Cluster,
    /// Withdraws every VIP from BGP for maintenance (`on`), or announces them again;
    /// connections go on being forwarded. Answers with the cluster report.
    Drain { on: bool },
    /// Service changes applied all or none and published as one snapshot (`-R`):
    /// `{"generation":N,"applied":count}`, or the first failing command's error. With
    /// `replace` (`-R --replace`) the batch describes the whole table: services,
    /// real servers and local addresses it does not list are removed in the same
    /// transaction.
    Batch {
        requests: Vec<Request>,
        #[serde(default)]
        replace: bool,
    },
    /// Service changes applied one by one, in order, each as if sent alone (one the
    /// table refuses changes nothing, and the next is still applied), then published
    /// as one snapshot (`-R` without `--atomic`): `{"generation":N,"applied":count,
    /// "refused":[{"command":i,"error":"..."}]}`, `command` counting from 1. A command
    /// that is itself a [`Request::Batch`] can only be the one an ipvsadm line with
    /// `--synproxy` makes (`add_service` or `edit_service`, then that service's
    /// `set_synproxy`), which stands or falls whole; any other batch is refused.
    ApplyEach { requests: Vec<Request> },
    /// Opens a batch staged over several lines on this connection (a batch larger than
    /// one request line): `{"staged":0}`. Served by the control server itself.
    BatchBegin {
        #[serde(default)]
        replace: bool,
    },
    /// Adds commands to the connection's open batch: `{"staged":total}`.
    BatchPart { requests: Vec<Request> },
    /// Executes the connection's open batch as one [`Request::Batch`].
    BatchCommit,
    /// `sluicectl capture`: starts copying the frames `filter` selects (on the ports
    /// named in `interfaces`, all when empty) into the pcapng file `path` (absolute;
    /// written by the daemon), until `count` packets, `duration_ms`, or
    /// [`Request::CaptureStop`]; at most `snaplen` bytes of each (default 2048).
    /// Answered with a [`crate::control::report::CaptureReport`].
    CaptureStart {
        path: std::path::PathBuf,
        /// Who asked, from the control socket's peer credentials (`SO_PEERCRED`),
        /// never from the request: the file is created with this identity's
        /// permissions and is owned by it. `None` until the server stamps it.
        #[serde(skip)]
        requester: Option<Requester>,
        #[serde(default)]
        filter: Box<crate::dataplane::capture::CaptureFilter>,
        #[serde(default)]
        interfaces: Vec<String>,
        #[serde(default)]
        count: Option<u64>,
        #[serde(default)]
        duration_ms: Option<u64>,
        #[serde(default)]
        snaplen: Option<u16>,
    },
    /// The running capture's report, else the last one's.
    CaptureStatus,
    /// Ends the running capture (its file complete); answers its final report.
    CaptureStop,
}

/// Where a page of `list_connections` starts: the worker, and the position in its
/// session table (`worker` equal to the number of workers: the persistence templates,
/// `from` of them already listed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionsCursor {
    pub worker: usize,
    pub from: usize,
}

/// Sessions `-Lnc` lists unless asked for another bound: about 30 MB of JSON, under
/// the client's 64 MiB reply cap. Also the most one reply holds: a larger `max` is
/// cut to it ([`connections_bound`]).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 200_000;

/// The sessions one `list_connections` reply may hold for a request's `max`: the
/// reply is built whole in the daemon's memory before it is sent, so a client may not
/// ask for the whole table at once (millions of sessions, gigabytes of JSON); it
/// pages through it instead.
pub fn connections_bound(max: Option<u32>) -> u32 {
    max.unwrap_or(DEFAULT_MAX_CONNECTIONS)
        .min(DEFAULT_MAX_CONNECTIONS)
}

impl Request {
    /// The wire name of this request, as in its `cmd` field.
    pub fn command_name(&self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::Xstats { .. } => "xstats",
            Request::ZeroCounters => "zero_counters",
            Request::ZeroService { .. } => "zero_service",
            Request::ZeroServices => "zero_services",
            Request::ListServices => "list_services",
            Request::SaveServices => "save_services",
            Request::AddService { .. } => "add_service",
            Request::EditService { .. } => "edit_service",
            Request::DeleteService { .. } => "delete_service",
            Request::SetSynproxy { .. } => "set_synproxy",
            Request::SetSorryServer { .. } => "set_sorry_server",
            Request::SetSloppyTcp { .. } => "set_sloppy_tcp",
            Request::SetMhTableSize { .. } => "set_mh_table_size",
            Request::AddServer { .. } => "add_server",
            Request::EditServer { .. } => "edit_server",
            Request::DeleteServer { .. } => "delete_server",
            Request::Clear => "clear",
            Request::AddLaddr { .. } => "add_laddr",
            Request::DelLaddr { .. } => "del_laddr",
            Request::GetLaddr { .. } => "get_laddr",
            Request::AclAdd { .. } => "acl_add",
            Request::AclDel { .. } => "acl_del",
            Request::AclClear { .. } => "acl_clear",
            Request::AclList { .. } => "acl_list",
            Request::SetRateLimit { .. } => "set_rate_limit",
            Request::ListConnections { .. } => "list_connections",
            Request::SetTimeouts { .. } => "set_timeouts",
            Request::GetTimeouts => "get_timeouts",
            Request::ServiceRates { .. } => "service_rates",
            Request::Batch { .. } => "batch",
            Request::ApplyEach { .. } => "apply_each",
            Request::BatchBegin { .. } => "batch_begin",
            Request::BatchPart { .. } => "batch_part",
            Request::BatchCommit => "batch_commit",
            Request::Metrics => "metrics",
            Request::Events => "events",
            Request::Health => "health",
            Request::Vrrp => "vrrp",
            Request::Sync => "sync",
            Request::Neighbours => "neighbours",
            Request::Cluster => "cluster",
            Request::Drain { .. } => "drain",
            Request::Reload => "reload",
            Request::CaptureStart { .. } => "capture_start",
            Request::CaptureStatus => "capture_status",
            Request::CaptureStop => "capture_stop",
        }
    }

    /// Whether this is one of the batch commands, which cannot be nested in a batch.
    pub fn is_batch(&self) -> bool {
        matches!(
            self,
            Request::Batch { .. }
                | Request::ApplyEach { .. }
                | Request::BatchBegin { .. }
                | Request::BatchPart { .. }
                | Request::BatchCommit
        )
    }

    /// The request as one protocol line, newline included.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("a Request always serialises");
        line.push('\n');
        line
    }
}

/// The reply to one request: either `{"ok":true,"result":...}` or
/// `{"ok":false,"error":"..."}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    /// A successful reply carrying `result`.
    pub fn success(result: Value) -> Response {
        Response {
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    /// A failed reply. The message is flattened to one line because clients print it
    /// as `sluicectl: <message>` and scripts grep it.
    pub fn failure(message: impl Into<String>) -> Response {
        Response {
            ok: false,
            result: None,
            error: Some(one_line(&message.into())),
        }
    }

    /// The reply as one protocol line, newline included.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("a Response always serialises");
        line.push('\n');
        line
    }

    /// The line of a successful reply carrying `result`: what
    /// `Response::success(result).to_line()` writes, written straight from `result`,
    /// without a [`Value`] of it or a second copy of its text.
    pub fn success_line_of(result: &impl Serialize) -> Result<String, serde_json::Error> {
        let mut line = b"{\"ok\":true,\"result\":".to_vec();
        serde_json::to_writer(&mut line, result)?;
        line.extend_from_slice(b"}\n");
        // serde_json writes UTF-8 only; the check cannot fail.
        String::from_utf8(line).map_err(serde::ser::Error::custom)
    }

    /// The result of a successful reply or the daemon's error text. A success whose
    /// result was `null` arrives without a `result` field after the JSON round trip
    /// (serde reads `null` as `None`), so it maps back to `Value::Null`.
    pub fn into_result(self) -> Result<Value, String> {
        if self.ok {
            Ok(self.result.unwrap_or(Value::Null))
        } else {
            Err(self
                .error
                .unwrap_or_else(|| "daemon reported an error without a message".to_string()))
        }
    }
}

/// A reply read with its result left as JSON text, for a client that reads the result
/// straight into the report type it wants: a listing of 50,000 real servers is 18 MB
/// of JSON, and a [`Value`] tree of it (millions of small maps and strings) cost more
/// than the typed read itself.
#[derive(Deserialize)]
pub struct RawResponse<'a> {
    pub ok: bool,
    #[serde(default, borrow)]
    pub result: Option<&'a RawValue>,
    #[serde(default)]
    pub error: Option<String>,
}

impl RawResponse<'_> {
    /// As [`Response::into_result`]: the result's JSON text (`null` when the reply
    /// has none), or the daemon's error text.
    pub fn into_result(self) -> Result<Box<RawValue>, String> {
        match (self.ok, self.result) {
            (true, Some(result)) => Ok(result.to_owned()),
            (true, None) => Ok(RawValue::from_string("null".into()).expect("null is a JSON value")),
            (false, _) => Err(self
                .error
                .unwrap_or_else(|| "daemon reported an error without a message".to_string())),
        }
    }
}

/// Why a request line could not be turned into a [`Request`]. Each variant displays as
/// one line suitable for an error response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// The line is longer than [`MAX_REQUEST_BYTES`]; the server closes the connection
    /// because it cannot find where the next request starts without buffering the rest.
    Oversize,
    /// Not valid JSON (including invalid UTF-8).
    Malformed(String),
    /// Valid JSON, but not an object.
    NotAnObject,
    /// An object without a string `cmd` field.
    MissingCmd,
    /// `cmd` names no known command; `known` lists the ones that exist.
    UnknownCommand { cmd: String, known: String },
    /// A known command with missing, mistyped or unexpected arguments.
    BadArguments { cmd: String, detail: String },
}

impl ProtocolError {
    /// Whether the server must close the connection after reporting this error.
    pub fn closes_connection(&self) -> bool {
        matches!(self, ProtocolError::Oversize)
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::Oversize => write!(
                f,
                "request line longer than the {MAX_REQUEST_BYTES}-byte limit; closing connection"
            ),
            ProtocolError::Malformed(detail) => write!(f, "malformed request: {detail}"),
            ProtocolError::NotAnObject => {
                write!(
                    f,
                    "request must be a JSON object such as {{\"cmd\":\"status\"}}"
                )
            }
            ProtocolError::MissingCmd => {
                write!(
                    f,
                    "request has no \"cmd\" string field, e.g. {{\"cmd\":\"status\"}}"
                )
            }
            ProtocolError::UnknownCommand { cmd, known } => {
                write!(f, "unknown command \"{cmd}\" (known commands: {known})")
            }
            ProtocolError::BadArguments { cmd, detail } => {
                write!(f, "bad arguments for command \"{cmd}\": {detail}")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Parses one request line (without its newline; a trailing `\r` is tolerated).
pub fn parse_request(line: &[u8]) -> Result<Request, ProtocolError> {
    if line.len() > MAX_REQUEST_BYTES {
        return Err(ProtocolError::Oversize);
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let value: Value = serde_json::from_slice(line)
        .map_err(|error| ProtocolError::Malformed(one_line(&error.to_string())))?;
    let object = value.as_object().ok_or(ProtocolError::NotAnObject)?;
    let cmd = match object.get("cmd") {
        Some(Value::String(cmd)) => cmd.clone(),
        _ => return Err(ProtocolError::MissingCmd),
    };
    let request = serde_json::from_value::<Request>(value.clone())
        .map_err(|error| classify_error(cmd.clone(), &error))?;
    reject_unknown_fields(&cmd, object, &request)?;
    Ok(request)
}

/// serde's `deny_unknown_fields` covers struct variants but not unit variants of an
/// internally tagged enum, nor the structs inside a request (a persistence, a SYN
/// proxy setting), so also compare the received fields with the ones the parsed
/// request writes back, at every depth: anything extra (and not `null`) was not
/// understood, and a misspelt `prefx6` must not leave the prefix silently at its
/// default.
fn reject_unknown_fields(
    cmd: &str,
    received: &serde_json::Map<String, Value>,
    request: &Request,
) -> Result<(), ProtocolError> {
    let understood = serde_json::to_value(request).expect("a Request always serialises");
    let mut unknown = Vec::new();
    unknown_fields("", received, &understood, &mut unknown);
    if unknown.is_empty() {
        return Ok(());
    }
    Err(ProtocolError::BadArguments {
        cmd: cmd.to_string(),
        detail: format!("unknown field `{}`", unknown.join("`, `")),
    })
}

/// Appends to `unknown` the paths (`persistence.prefx6`, `requests[1].sevice`) of
/// the fields of `received` that `understood` lacks, looking into objects and into
/// arrays of the same length.
fn unknown_fields(
    path: &str,
    received: &serde_json::Map<String, Value>,
    understood: &Value,
    unknown: &mut Vec<String>,
) {
    for (key, value) in received.iter().filter(|(_, v)| !v.is_null()) {
        let here = match path {
            "" => key.clone(),
            _ => format!("{path}.{key}"),
        };
        match understood.get(key.as_str()) {
            None => unknown.push(here),
            Some(known) => nested_unknown(&here, value, known, unknown),
        }
    }
}

fn nested_unknown(path: &str, received: &Value, understood: &Value, unknown: &mut Vec<String>) {
    match (received, understood) {
        (Value::Object(fields), known @ Value::Object(_)) => {
            unknown_fields(path, fields, known, unknown)
        }
        (Value::Array(items), Value::Array(known)) if items.len() == known.len() => {
            for (i, (item, known)) in items.iter().zip(known).enumerate() {
                nested_unknown(&format!("{path}[{i}]"), item, known, unknown);
            }
        }
        _ => {}
    }
}

/// Turns serde's error into ours. serde reports an unknown tag as
/// "unknown variant `x`, expected one of `a`, `b`"; the list comes from the enum itself,
/// so reusing it keeps the known-command list in step with [`Request`] with no second
/// list to maintain.
fn classify_error(cmd: String, error: &serde_json::Error) -> ProtocolError {
    let message = error.to_string();
    if message.starts_with("unknown variant") {
        let known = message
            .split_once("expected ")
            .map(|(_, expected)| expected.trim_start_matches("one of ").replace('`', ""))
            .unwrap_or_else(|| message.clone());
        ProtocolError::UnknownCommand { cmd, known }
    } else {
        ProtocolError::BadArguments {
            cmd,
            detail: one_line(&message),
        }
    }
}

/// Collapses line breaks so a message can never split a protocol or terminal line.
pub(crate) fn one_line(text: &str) -> String {
    text.split(['\n', '\r'])
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_round_trip_through_their_wire_form() {
        let cases = [
            (Request::Status, r#"{"cmd":"status"}"#),
            (Request::Xstats { port: 3 }, r#"{"cmd":"xstats","port":3}"#),
            (Request::ZeroCounters, r#"{"cmd":"zero_counters"}"#),
            (Request::ZeroServices, r#"{"cmd":"zero_services"}"#),
            (Request::SaveServices, r#"{"cmd":"save_services"}"#),
            (
                Request::ListConnections {
                    max: Some(5),
                    page: None,
                },
                r#"{"cmd":"list_connections","max":5}"#,
            ),
        ];
        for (request, wire) in cases {
            assert_eq!(request.to_line(), format!("{wire}\n"));
            assert_eq!(parse_request(wire.as_bytes()), Ok(request.clone()));
            assert_eq!(request.command_name(), json_cmd(wire));
        }
    }

    #[test]
    fn local_address_requests_round_trip_through_their_wire_form() {
        let service = ServiceKey::new(
            crate::model::Protocol::Tcp,
            std::net::Ipv4Addr::new(198, 18, 1, 1),
            80,
        );
        let ip: IpAddr = std::net::Ipv4Addr::new(198, 18, 0, 50).into();
        let svc = r#""service":{"proto":"tcp","vip":"198.18.1.1","port":80}"#;
        let cases = [
            (
                Request::AddLaddr { service, ip },
                format!(r#"{{"cmd":"add_laddr",{svc},"ip":"198.18.0.50"}}"#),
            ),
            (
                Request::DelLaddr { service, ip },
                format!(r#"{{"cmd":"del_laddr",{svc},"ip":"198.18.0.50"}}"#),
            ),
            (
                Request::GetLaddr { service },
                format!(r#"{{"cmd":"get_laddr",{svc}}}"#),
            ),
        ];
        for (request, wire) in cases {
            assert_eq!(request.to_line(), format!("{wire}\n"));
            assert_eq!(parse_request(wire.as_bytes()), Ok(request.clone()));
            assert_eq!(request.command_name(), json_cmd(&wire));
        }
    }

    #[test]
    fn local_address_requests_check_their_arguments() {
        let svc = r#""service":{"proto":"tcp","vip":"198.18.1.1","port":80}"#;
        for (line, cmd, needle) in [
            (
                format!(r#"{{"cmd":"add_laddr",{svc}}}"#),
                "add_laddr",
                "missing field `ip`",
            ),
            (
                format!(r#"{{"cmd":"del_laddr",{svc},"ip":"198.18.0.300"}}"#),
                "del_laddr",
                "invalid IP address syntax",
            ),
            (
                r#"{"cmd":"get_laddr"}"#.to_string(),
                "get_laddr",
                "missing field `service`",
            ),
            (
                format!(r#"{{"cmd":"get_laddr",{svc},"ip":"198.18.0.50"}}"#),
                "get_laddr",
                "unknown field `ip`",
            ),
        ] {
            let error = parse_request(line.as_bytes()).unwrap_err();
            assert!(
                matches!(&error, ProtocolError::BadArguments { cmd: c, detail }
                    if c == cmd && detail.contains(needle)),
                "{line}: {error:?}"
            );
        }
    }

    fn json_cmd(wire: &str) -> String {
        let value: Value = serde_json::from_str(wire).unwrap();
        value["cmd"].as_str().unwrap().to_string()
    }

    /// The fuzzer's seeds (fuzz/seeds/control_request) must stay real requests: every
    /// JSON seed parses and survives the wire, so the fuzzer starts from valid input.
    #[test]
    fn fuzz_seed_requests_parse_and_round_trip() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/control_request");
        let mut json = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            if bytes.first() != Some(&b'{') {
                continue; // an ipvsadm command line
            }
            let request = parse_request(&bytes)
                .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&bytes)));
            let line = request.to_line();
            assert_eq!(parse_request(line.trim_end().as_bytes()), Ok(request));
            json += 1;
        }
        assert!(json >= 20, "only {json} JSON seeds in {dir}");
    }

    #[test]
    fn trailing_carriage_return_is_tolerated() {
        assert_eq!(
            parse_request(b"{\"cmd\":\"status\"}\r"),
            Ok(Request::Status)
        );
    }

    #[test]
    fn malformed_json_is_reported_on_one_line() {
        let error = parse_request(b"{\"cmd\":").unwrap_err();
        assert!(matches!(error, ProtocolError::Malformed(_)), "{error:?}");
        let text = error.to_string();
        assert!(text.starts_with("malformed request: "), "{text}");
        assert!(!text.contains('\n'));
        assert!(!error.closes_connection());
    }

    #[test]
    fn invalid_utf8_is_malformed_not_a_panic() {
        let error = parse_request(b"{\"cmd\":\"\xff\xfe\"}").unwrap_err();
        assert!(matches!(error, ProtocolError::Malformed(_)), "{error:?}");
    }

    #[test]
    fn non_object_and_missing_cmd_are_distinguished() {
        assert_eq!(parse_request(b"[1,2]"), Err(ProtocolError::NotAnObject));
        assert_eq!(
            parse_request(b"\"status\""),
            Err(ProtocolError::NotAnObject)
        );
        assert_eq!(parse_request(b"{}"), Err(ProtocolError::MissingCmd));
        assert_eq!(
            parse_request(b"{\"cmd\":7}"),
            Err(ProtocolError::MissingCmd)
        );
    }

    #[test]
    fn unknown_command_lists_every_known_command() {
        let error = parse_request(b"{\"cmd\":\"reboot\"}").unwrap_err();
        let text = error.to_string();
        assert_eq!(
            text,
            "unknown command \"reboot\" (known commands: status, xstats, zero_counters, zero_service, zero_services, \
             list_services, save_services, add_service, edit_service, delete_service, set_synproxy, set_sorry_server, set_sloppy_tcp, set_mh_table_size, add_server, \
             edit_server, delete_server, clear, add_laddr, del_laddr, get_laddr, \
             acl_add, acl_del, acl_clear, acl_list, set_rate_limit, \
             list_connections, set_timeouts, get_timeouts, service_rates, metrics, reload, events, health, vrrp, sync, neighbours, cluster, drain, batch, apply_each, batch_begin, batch_part, batch_commit, \
             capture_start, capture_status, capture_stop)"
        );
    }

    #[test]
    fn missing_argument_names_the_field() {
        let error = parse_request(b"{\"cmd\":\"xstats\"}").unwrap_err();
        assert_eq!(
            error,
            ProtocolError::BadArguments {
                cmd: "xstats".into(),
                detail: "missing field `port`".into()
            }
        );
        assert_eq!(
            error.to_string(),
            "bad arguments for command \"xstats\": missing field `port`"
        );
    }

    #[test]
    fn mistyped_and_out_of_range_arguments_are_rejected() {
        for line in [
            &b"{\"cmd\":\"xstats\",\"port\":\"zero\"}"[..],
            b"{\"cmd\":\"xstats\",\"port\":70000}",
            b"{\"cmd\":\"xstats\",\"port\":-1}",
        ] {
            let error = parse_request(line).unwrap_err();
            assert!(
                matches!(&error, ProtocolError::BadArguments { cmd, .. } if cmd == "xstats"),
                "{error:?}"
            );
        }
    }

    #[test]
    fn unexpected_arguments_are_rejected_even_on_commands_without_fields() {
        let error = parse_request(b"{\"cmd\":\"zero_counters\",\"port\":1}").unwrap_err();
        assert!(
            matches!(&error, ProtocolError::BadArguments { cmd, detail }
                if cmd == "zero_counters" && detail.contains("port")),
            "{error:?}"
        );
        assert_eq!(
            parse_request(b"{\"cmd\":\"status\",\"verbose\":true}")
                .unwrap_err()
                .to_string(),
            "bad arguments for command \"status\": unknown field `verbose`"
        );
        let error = parse_request(b"{\"cmd\":\"xstats\",\"port\":1,\"prot\":2}").unwrap_err();
        assert_eq!(
            error.to_string(),
            "bad arguments for command \"xstats\": unknown field `prot`, expected `port`"
        );
    }

    #[test]
    fn oversize_lines_are_rejected_before_parsing_and_close_the_connection() {
        let line = vec![b' '; MAX_REQUEST_BYTES + 1];
        let error = parse_request(&line).unwrap_err();
        assert_eq!(error, ProtocolError::Oversize);
        assert!(error.closes_connection());
        assert!(error.to_string().contains("65536-byte limit"));
        // A line of exactly the limit is still accepted (trailing blanks are valid JSON).
        let mut padded = b"{\"cmd\":\"status\"}".to_vec();
        padded.resize(MAX_REQUEST_BYTES, b' ');
        assert_eq!(parse_request(&padded), Ok(Request::Status));
    }

    #[test]
    fn responses_serialise_without_the_absent_field() {
        let success = Response::success(json!({"a": 1}));
        assert_eq!(success.to_line(), "{\"ok\":true,\"result\":{\"a\":1}}\n");
        let failure = Response::failure("no port 9");
        assert_eq!(
            failure.to_line(),
            "{\"ok\":false,\"error\":\"no port 9\"}\n"
        );
    }

    /// A reply written straight from its result is the line a value's reply is, and
    /// reads back as the same response.
    #[test]
    fn a_reply_from_json_text_is_the_line_of_the_same_value() {
        let result = json!({"services": [{"vip": "10.0.0.1:80", "weight": 1.5}], "n": null});
        let line = Response::success_line_of(&result).unwrap();
        assert_eq!(line, Response::success(result.clone()).to_line());
        let read: Response = serde_json::from_str(&line).unwrap();
        assert_eq!(read.into_result(), Ok(result));
    }

    #[test]
    fn failure_messages_are_flattened_to_one_line() {
        let failure = Response::failure("first\nsecond\r\n third");
        assert_eq!(failure.error.as_deref(), Some("first second third"));
    }

    #[test]
    fn into_result_maps_null_success_and_errors() {
        let parsed: Response = serde_json::from_str("{\"ok\":true,\"result\":null}").unwrap();
        assert_eq!(parsed.into_result(), Ok(Value::Null));
        let parsed: Response = serde_json::from_str("{\"ok\":false,\"error\":\"boom\"}").unwrap();
        assert_eq!(parsed.into_result(), Err("boom".to_string()));
        let parsed: Response = serde_json::from_str("{\"ok\":false}").unwrap();
        assert!(parsed
            .into_result()
            .unwrap_err()
            .contains("without a message"));
    }

    /// A misspelt field inside a request's struct is refused by its path, as one at
    /// the top is: it must not leave the setting silently at its default.
    #[test]
    fn unknown_fields_inside_a_request_are_refused_too() {
        use crate::model::{Persistence, SchedulerKind, ServiceKey};
        let request = Request::AddService {
            service: ServiceKey::new(
                crate::model::Protocol::Tcp,
                std::net::Ipv4Addr::new(198, 18, 1, 1),
                80,
            ),
            scheduler: Some(SchedulerKind::Rr),
            persistence: Some(Persistence::new(300)),
            sched_flags: None,
        };
        let line = request.to_line();
        assert_eq!(
            parse_request(line.trim_end().as_bytes()),
            Ok(request.clone())
        );
        let mut value: Value = serde_json::from_str(&line).unwrap();
        value["persistence"]["prefx6"] = Value::from(64);
        let error = parse_request(value.to_string().as_bytes()).unwrap_err();
        assert_eq!(
            error.to_string(),
            "bad arguments for command \"add_service\": unknown field `persistence.prefx6`"
        );
        // Inside a batch's requests too.
        let batch = Request::Batch {
            requests: vec![Request::ZeroServices, request],
            replace: false,
        };
        let mut value: Value = serde_json::from_str(&batch.to_line()).unwrap();
        value["requests"][1]["persistence"]["timeout_ms"] = Value::from(5);
        let error = parse_request(value.to_string().as_bytes()).unwrap_err();
        assert!(
            error
                .to_string()
                .ends_with("unknown field `requests[1].persistence.timeout_ms`"),
            "{error}"
        );
    }

    #[test]
    fn a_connection_listing_reply_holds_at_most_the_default_bound() {
        assert_eq!(connections_bound(None), DEFAULT_MAX_CONNECTIONS);
        assert_eq!(connections_bound(Some(3)), 3);
        assert_eq!(connections_bound(Some(u32::MAX)), DEFAULT_MAX_CONNECTIONS);
    }
}
