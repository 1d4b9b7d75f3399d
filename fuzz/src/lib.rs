//! What the fuzz targets share: an Internet checksum written here from RFC 1071 (so a
//! rewrite is checked by code that is not the code under test), a checker of the
//! checksums and lengths of an output frame, a builder of mostly-valid frames from
//! fuzzer bytes, and the EAL and mempool the forwarder's bursts come from.
#![allow(clippy::missing_panics_doc)]

pub mod bed;
pub mod check;
pub mod eal;
pub mod frames;
pub mod net;

/// Splits a fuzz input into records: a tag byte, a 16-bit big-endian length and that
/// many bytes (fewer at the end of the input). The seeds written from pcaps use the
/// same format, so a golden frame is one record.
pub fn records(mut data: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < 3 {
            return None;
        }
        let tag = data[0];
        let len = u16::from_be_bytes([data[1], data[2]]) as usize;
        let rest = &data[3..];
        let (body, tail) = rest.split_at(len.min(rest.len()));
        data = tail;
        Some((tag, body))
    })
}

/// One record in the format [`records`] reads.
pub fn record(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&(body.len().min(u16::MAX as usize) as u16).to_be_bytes());
    out.extend_from_slice(&body[..body.len().min(u16::MAX as usize)]);
    out
}
