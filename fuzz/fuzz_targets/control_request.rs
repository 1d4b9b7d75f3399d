//! The control socket's request parser, the ipvsadm argument parser and ipvsadm 1.31's
//! checks of those arguments, fed arbitrary bytes. Properties: none panics; a request either parser accepts survives the
//! wire (`to_line` -> `parse_request`) unchanged, since the daemon must understand
//! every request `sluicectl` can send.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::control::protocol::{parse_request, Request, MAX_REQUEST_BYTES};
use sluice::control::{ipvsadm, ipvsadm_usage};

fn round_trips(request: &Request) {
    let line = request.to_line();
    let wire = line.strip_suffix('\n').expect("to_line ends in a newline");
    assert!(
        !wire.contains('\n'),
        "a request line holds no newline: {wire:?}"
    );
    if wire.len() > MAX_REQUEST_BYTES {
        return; // refused as oversize, by design
    }
    match parse_request(wire.as_bytes()) {
        Ok(back) => assert_eq!(&back, request, "changed on the wire: {wire}"),
        Err(e) => panic!("the daemon refuses what a client sends: {wire}: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    // 1. The raw line as the control thread would receive it.
    if let Ok(request) = parse_request(data) {
        round_trips(&request);
    }
    // 2. The same bytes as sluicectl's ipvsadm-style arguments (split on NUL and
    //    whitespace, as a shell would hand them over).
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: Vec<String> = text
        .split(|c: char| c == '\0' || c.is_whitespace())
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect();
    if let Ok(command) = ipvsadm::parse(&args) {
        round_trips(&command.request);
    }
    // 3. The same arguments judged as ipvsadm 1.31 judges them (called as ipvsadm).
    let _ = ipvsadm_usage::check("ipvsadm", &args);
});
