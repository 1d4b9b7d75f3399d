//! The optional shared key of the sync peers: an HMAC-SHA256 (RFC 2104, FIPS 180-4)
//! trailer over the whole message (header and records), so a forged or altered message
//! is rejected before any of it is believed. Verification compares in constant time
//! (`hmac`'s `verify_slice`), so a forger learns nothing from how long a rejection takes.
//!
//! HMAC authenticates, it does not stop replays: a captured message can be sent again.
//! The header's sender epoch and sequence number, which the HMAC covers, let the
//! receiver refuse one (`sync::peers`).
use core::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::session::replication::{MessageFlags, Packet, HMAC_LEN};

type HmacSha256 = Hmac<Sha256>;

/// Shortest key accepted from the configuration: 128 bits.
pub const MIN_KEY_LEN: usize = 16;

/// Why a key was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyError {
    /// Shorter than [`MIN_KEY_LEN`] bytes.
    TooShort(usize),
    /// Not an even number of hexadecimal digits.
    NotHex,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::TooShort(len) => {
                write!(f, "sync key of {len} bytes (at least {MIN_KEY_LEN})")
            }
            KeyError::NotHex => f.write_str("sync key is not hexadecimal"),
        }
    }
}

impl std::error::Error for KeyError {}

/// Why a message's trailer was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// A key is configured but the message carries no trailer.
    Missing,
    /// No key is configured but the message carries a trailer: the peers disagree.
    Unexpected,
    /// The trailer is not the message's HMAC under our key.
    Mismatch,
}

/// The shared sync key, with the HMAC state keyed once (each message clones it).
#[derive(Clone)]
pub struct SyncKey {
    keyed: HmacSha256,
}

impl fmt::Debug for SyncKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        f.write_str("SyncKey(..)")
    }
}

impl SyncKey {
    /// A key of at least [`MIN_KEY_LEN`] bytes.
    pub fn new(key: &[u8]) -> Result<SyncKey, KeyError> {
        if key.len() < MIN_KEY_LEN {
            return Err(KeyError::TooShort(key.len()));
        }
        Ok(SyncKey { keyed: keyed(key) })
    }

    /// A key written as hexadecimal digits (as a config file holds it).
    pub fn from_hex(hex: &str) -> Result<SyncKey, KeyError> {
        let hex = hex.trim().as_bytes();
        if !hex.len().is_multiple_of(2) {
            return Err(KeyError::NotHex);
        }
        let digit = |c: u8| (c as char).to_digit(16).ok_or(KeyError::NotHex);
        let bytes = hex
            .chunks_exact(2)
            .map(|pair| Ok((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
            .collect::<Result<Vec<u8>, KeyError>>()?;
        SyncKey::new(&bytes)
    }

    /// The HMAC-SHA256 of `data`.
    pub fn tag(&self, data: &[u8]) -> [u8; HMAC_LEN] {
        let mut mac = self.keyed.clone();
        mac.update(data);
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is the HMAC of `data`, compared in constant time.
    pub fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        let mut mac = self.keyed.clone();
        mac.update(data);
        mac.verify_slice(tag).is_ok()
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length (longer ones are hashed first), so this cannot fail.
    <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC accepts any key length")
}

/// Writes the trailer of a finished message whose header has the AUTHENTICATED flag
/// (as `MessageBuilder::new(.., authenticated = true)` sets it), over its header and
/// records. `message` is the whole message, trailer room included.
pub fn seal(message: &mut [u8], key: &SyncKey) {
    let mut packet = Packet::new_unchecked(&mut *message);
    debug_assert!(packet.flags().contains(MessageFlags::AUTHENTICATED));
    let tag = key.tag(packet.authenticated_bytes());
    packet.trailer_mut().copy_from_slice(&tag);
}

/// Checks a length-checked message's trailer against `key`. With a key, the trailer
/// is required; without one, it must be absent (a configuration mismatch between the
/// peers is reported, not papered over).
pub fn verify<T: AsRef<[u8]>>(packet: &Packet<T>, key: Option<&SyncKey>) -> Result<(), AuthError> {
    match (key, packet.trailer()) {
        (Some(key), Some(trailer)) => {
            if key.verify(packet.authenticated_bytes(), trailer) {
                Ok(())
            } else {
                Err(AuthError::Mismatch)
            }
        }
        (Some(_), None) => Err(AuthError::Missing),
        (None, Some(_)) => Err(AuthError::Unexpected),
        (None, None) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ForwardMode;
    use crate::model::Protocol;
    use crate::session::replication::{
        MessageBuilder, MessageRepr, MessageType, RecordOp, RecordRepr, HEADER_LEN,
    };
    use std::net::{Ipv4Addr, SocketAddrV4};

    fn unhex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 4231 test cases 1-4, 6 and 7 (HMAC-SHA-256 outputs). Case 5 checks a
    /// truncated output, which this module never uses. Keys under 16 bytes are test
    /// vectors only, so they go through the primitive, not `SyncKey::new`.
    #[test]
    fn rfc4231_vectors() {
        let cases: [(Vec<u8>, Vec<u8>, &str); 6] = [
            (
                vec![0x0b; 20],
                b"Hi There".to_vec(),
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            ),
            (
                b"Jefe".to_vec(),
                b"what do ya want for nothing?".to_vec(),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                vec![0xaa; 20],
                vec![0xdd; 50],
                "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
            ),
            (
                unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"),
                vec![0xcd; 50],
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
            ),
            (
                vec![0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
            (
                vec![0xaa; 131],
                b"This is a test using a larger than block-size key and a larger than \
                  block-size data. The key needs to be hashed before being used by the \
                  HMAC algorithm."
                    .to_vec(),
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            ),
        ];
        for (i, (key, data, want)) in cases.iter().enumerate() {
            let key = SyncKey { keyed: keyed(key) };
            let want = unhex(want);
            assert_eq!(key.tag(data).to_vec(), want, "case {}", i + 1);
            assert!(key.verify(data, &want));
            let mut wrong = want.clone();
            wrong[31] ^= 1;
            assert!(!key.verify(data, &wrong));
            assert!(!key.verify(data, &want[..16]), "a short tag never matches");
        }
    }

    #[test]
    fn key_from_config() {
        assert_eq!(SyncKey::new(&[7; 15]).unwrap_err(), KeyError::TooShort(15));
        assert!(SyncKey::new(&[7; 16]).is_ok());
        let hex = "000102030405060708090a0b0c0d0e0F";
        let from_hex = SyncKey::from_hex(hex).unwrap();
        let direct = SyncKey::new(&(0..16).collect::<Vec<u8>>()).unwrap();
        assert_eq!(from_hex.tag(b"x"), direct.tag(b"x"));
        assert_eq!(SyncKey::from_hex("0g").unwrap_err(), KeyError::NotHex);
        assert_eq!(SyncKey::from_hex("abc").unwrap_err(), KeyError::NotHex);
        assert_eq!(SyncKey::from_hex("ab").unwrap_err(), KeyError::TooShort(1));
        assert_eq!(format!("{from_hex:?}"), "SyncKey(..)");
    }

    fn sealed_message(buf: &mut [u8], key: &SyncKey) -> usize {
        let header = MessageRepr {
            message_type: MessageType::SessionBatch,
            flags: Default::default(),
            sender: 1,
            recipient: Ipv4Addr::UNSPECIFIED,
            epoch: 5,
            sequence: 99,
            dump_id: 0,
            chunk: 0,
            count: 0,
        };
        let mut builder = MessageBuilder::new(buf, header, 1500, true);
        for i in 0..3u16 {
            builder
                .push(&RecordRepr::template(
                    RecordOp::Update,
                    Protocol::Udp,
                    SocketAddrV4::new(Ipv4Addr::new(203, 0, 113, 1), 53),
                    Ipv4Addr::new(10, 0, i as u8, 0),
                    24,
                    SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 1), 53),
                    ForwardMode::Dr,
                    60_000,
                ))
                .unwrap();
        }
        let message = builder.finish();
        seal(message, key);
        message.len()
    }

    #[test]
    fn sealed_message_verifies_and_every_tampered_byte_fails() {
        let key = SyncKey::new(b"sixteen byte key").unwrap();
        let mut buf = [0u8; 512];
        let len = sealed_message(&mut buf, &key);
        let message = &buf[..len];
        assert_eq!(
            len,
            HEADER_LEN + 3 * crate::session::replication::RECORD_LEN + HMAC_LEN
        );
        let packet = Packet::new_checked(message).unwrap();
        assert_eq!(verify(&packet, Some(&key)), Ok(()));

        // Flip one bit anywhere (header, records, trailer): rejected, by the length
        // checks or by the HMAC.
        for at in 0..len {
            let mut tampered = message.to_vec();
            tampered[at] ^= 0x10;
            let rejected = match Packet::new_checked(&tampered[..]) {
                Err(_) => true,
                Ok(p) => verify(&p, Some(&key)).is_err(),
            };
            assert!(rejected, "bit flip at byte {at} accepted");
        }

        // Another key, no key, a stripped trailer.
        let other = SyncKey::new(b"another 16B key!").unwrap();
        assert_eq!(verify(&packet, Some(&other)), Err(AuthError::Mismatch));
        assert_eq!(verify(&packet, None), Err(AuthError::Unexpected));
        let mut stripped = message[..len - HMAC_LEN].to_vec();
        stripped[7] &= !0x01; // clear AUTHENTICATED so the lengths agree again
        let stripped = Packet::new_checked(&stripped[..]).unwrap();
        assert_eq!(verify(&stripped, Some(&key)), Err(AuthError::Missing));
        assert_eq!(verify(&stripped, None), Ok(()));
    }
}
