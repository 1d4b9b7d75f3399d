//! The keys Sluice nodes share to authenticate what they send each other: session
//! sync messages (`sync::auth`) and VRRP advertisements (`vrrp::auth`). A tag is the
//! HMAC-SHA256 (RFC 2104, FIPS 180-4) of the bytes to protect; verification compares
//! in constant time (`hmac`'s `verify_slice`), so a forger learns nothing from how
//! long a rejection takes.
//!
//! A tag authenticates, it does not stop replays: each protocol carries its own
//! freshness (sync's epoch and sequence window, VRRP's counter) under the tag.
use core::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The length of a tag: HMAC-SHA256's whole output.
pub const TAG_LEN: usize = 32;

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
                write!(f, "key of {len} bytes (at least {MIN_KEY_LEN})")
            }
            KeyError::NotHex => f.write_str("key is not hexadecimal"),
        }
    }
}

impl std::error::Error for KeyError {}

/// A key the nodes share, with the HMAC state keyed once (each message clones it).
#[derive(Clone)]
pub struct SharedKey {
    keyed: HmacSha256,
}

impl fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        f.write_str("SharedKey(..)")
    }
}

impl SharedKey {
    /// A key of at least [`MIN_KEY_LEN`] bytes.
    pub fn new(key: &[u8]) -> Result<SharedKey, KeyError> {
        if key.len() < MIN_KEY_LEN {
            return Err(KeyError::TooShort(key.len()));
        }
        Ok(SharedKey { keyed: keyed(key) })
    }

    /// A key written as hexadecimal digits (as a config file holds it).
    pub fn from_hex(hex: &str) -> Result<SharedKey, KeyError> {
        let hex = hex.trim().as_bytes();
        if !hex.len().is_multiple_of(2) {
            return Err(KeyError::NotHex);
        }
        let digit = |c: u8| (c as char).to_digit(16).ok_or(KeyError::NotHex);
        let bytes = hex
            .chunks_exact(2)
            .map(|pair| Ok((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
            .collect::<Result<Vec<u8>, KeyError>>()?;
        SharedKey::new(&bytes)
    }

    /// The HMAC-SHA256 of `data`.
    pub fn tag(&self, data: &[u8]) -> [u8; TAG_LEN] {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 4231 test cases 1-4, 6 and 7 (HMAC-SHA-256 outputs). Case 5 checks a
    /// truncated output, which this module never uses. Keys under 16 bytes are test
    /// vectors only, so they go through the primitive, not `SharedKey::new`.
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
            let key = SharedKey { keyed: keyed(key) };
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
        assert_eq!(
            SharedKey::new(&[7; 15]).unwrap_err(),
            KeyError::TooShort(15)
        );
        assert!(SharedKey::new(&[7; 16]).is_ok());
        let hex = "000102030405060708090a0b0c0d0e0F";
        let from_hex = SharedKey::from_hex(hex).unwrap();
        let direct = SharedKey::new(&(0..16).collect::<Vec<u8>>()).unwrap();
        assert_eq!(from_hex.tag(b"x"), direct.tag(b"x"));
        assert_eq!(SharedKey::from_hex("0g").unwrap_err(), KeyError::NotHex);
        assert_eq!(SharedKey::from_hex("abc").unwrap_err(), KeyError::NotHex);
        assert_eq!(
            SharedKey::from_hex("ab").unwrap_err(),
            KeyError::TooShort(1)
        );
        assert_eq!(format!("{from_hex:?}"), "SharedKey(..)");
    }
}
