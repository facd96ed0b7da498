//! Lowercase hexadecimal text for hashes, keys and signatures.

/// Lowercase hex of `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Exactly `N` bytes from `2 * N` hex digits (either case); the reason on failure.
pub fn decode<const N: usize>(text: &str) -> Result<[u8; N], String> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return Err(format!(
            "expected {} hex characters, found {}",
            2 * N,
            digits.len()
        ));
    }
    let nibble = |i: usize| -> Result<u8, String> {
        let c = digits[i];
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(format!(
                "character {} ({:?}) is not a hex digit",
                i + 1,
                char::from(c)
            )),
        }
    };
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = nibble(2 * i)? << 4 | nibble(2 * i + 1)?;
    }
    Ok(out)
}

/// True for a full content hash as used in bundle directory names (64 lowercase hex).
pub fn is_content_hash(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejections() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(encode(&bytes), "0001abff");
        assert_eq!(decode::<4>("0001ABff").unwrap(), bytes);
        assert!(decode::<4>("0001abf").unwrap_err().contains("expected 8"));
        assert!(decode::<4>("0001abfg").unwrap_err().contains("character 8"));
        assert!(is_content_hash(&"a".repeat(64)));
        assert!(!is_content_hash(&"A".repeat(64)));
        assert!(!is_content_hash(&"a".repeat(63)));
    }
}
