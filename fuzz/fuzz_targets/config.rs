//! The config reader: TOML text to a validated `Config` (`Config::parse`), then the
//! services the daemon builds from it (`Services::from_config`) and its EAL argv.
//!
//! The same text is also read as keepalived.conf by the keepalived import.
//!
//! Properties: no panic on any text; a config the reader accepts builds its services
//! (the daemon must not refuse at start what the reader validated); parsing is
//! deterministic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::config::Config;
use sluice::daemon::Services;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The same text as keepalived.conf (`sluicectl import-keepalived`): an answer
    // for any text, the same one twice.
    let first = sluice::config::keepalived::import(text, "fuzz.conf");
    assert_eq!(first, sluice::config::keepalived::import(text, "fuzz.conf"));
    let path = Path::new("fuzz.toml");
    let Ok(cfg) = Config::parse(text, path) else {
        return;
    };
    if let Err(e) = Services::from_config(&cfg) {
        panic!("the reader accepted a config whose services cannot be built: {e}\n{text}");
    }
    let _ = cfg.eal_args();
    let again = Config::parse(text, path).expect("accepted once, refused the second time");
    assert_eq!(format!("{again:?}"), format!("{cfg:?}"));
});
