//! The optional shared key of the sync peers: an HMAC-SHA256 (RFC 2104, FIPS 180-4)
//! trailer over the whole message (header and records), so a forged or altered message
//! is rejected before any of it is believed. Verification compares in constant time
//! (`hmac`'s `verify_slice`), so a forger learns nothing from how long a rejection takes.
//!
//! HMAC authenticates, it does not stop replays: a captured message can be sent again.
//! The header's sender epoch and sequence number, which the HMAC covers, let the
//! receiver refuse one (`sync::peers`).
use crate::ha::auth::{SharedKey, TAG_LEN};
use crate::session::replication::{MessageFlags, Packet, HMAC_LEN};

// The trailer is one whole tag.
const _: () = assert!(HMAC_LEN == TAG_LEN);

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

/// Writes the trailer of a finished message whose header has the AUTHENTICATED flag
/// (as `MessageBuilder::new(.., authenticated = true)` sets it), over its header and
/// records. `message` is the whole message, trailer room included.
pub fn seal(message: &mut [u8], key: &SharedKey) {
    let mut packet = Packet::new_unchecked(&mut *message);
    debug_assert!(packet.flags().contains(MessageFlags::AUTHENTICATED));
    let tag = key.tag(packet.authenticated_bytes());
    packet.trailer_mut().copy_from_slice(&tag);
}

/// Checks a length-checked message's trailer against `key`. With a key, the trailer
/// is required; without one, it must be absent (a configuration mismatch between the
/// peers is reported, not papered over).
pub fn verify<T: AsRef<[u8]>>(
    packet: &Packet<T>,
    key: Option<&SharedKey>,
) -> Result<(), AuthError> {
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

    fn sealed_message(buf: &mut [u8], key: &SharedKey) -> usize {
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
        let key = SharedKey::new(b"sixteen byte key").unwrap();
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
        let other = SharedKey::new(b"another 16B key!").unwrap();
        assert_eq!(verify(&packet, Some(&other)), Err(AuthError::Mismatch));
        assert_eq!(verify(&packet, None), Err(AuthError::Unexpected));
        let mut stripped = message[..len - HMAC_LEN].to_vec();
        stripped[7] &= !0x01; // clear AUTHENTICATED so the lengths agree again
        let stripped = Packet::new_checked(&stripped[..]).unwrap();
        assert_eq!(verify(&stripped, Some(&key)), Err(AuthError::Missing));
        assert_eq!(verify(&stripped, None), Ok(()));
    }
}
