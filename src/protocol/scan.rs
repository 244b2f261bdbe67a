//! Finding where a JSON string ends, eight bytes at a time: the relay's reader and the
//! common-send reader both walk strings this way.

/// The bytes of these eight (little-endian) that end or escape a string, or may not be
/// in one (a control character), as their high bits. The lowest one set is exact (a
/// borrow can only mark bytes above it).
fn special(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let below = |v: u64, n: u64| v.wrapping_sub(n * ONES) & !v & HIGHS;
    let equal = |v: u64, b: u8| below(v ^ (u64::from(b) * ONES), 1);
    below(word, 0x20) | equal(word, b'"') | equal(word, b'\\')
}

/// Where the first byte at or after `at` is that ends or escapes a string (`"`, `\`) or
/// may not be in one (below 0x20); None when there is none.
#[inline]
pub(super) fn next_special(text: &[u8], mut at: usize) -> Option<usize> {
    while let Some(word) = text.get(at..at + 8) {
        let found = special(u64::from_le_bytes(word.try_into().unwrap_or_default()));
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = text.get(at..)?;
    let found = tail
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    Some(at + found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_special_byte_wherever_it_is() {
        for len in 0..24 {
            for at in 0..len {
                for special_byte in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                    let mut text = vec![b'a'; len];
                    text[at] = special_byte;
                    assert_eq!(
                        next_special(&text, 0),
                        Some(at),
                        "{len} {at} {special_byte}"
                    );
                    assert_eq!(next_special(&text, at), Some(at));
                    assert_eq!(next_special(&text, at + 1), None);
                }
            }
            assert_eq!(next_special(&vec![0x7f; len], 0), None);
            assert_eq!(next_special("é€😀".as_bytes(), 0), None);
        }
        assert_eq!(next_special(b"ab", 5), None);
    }

    #[test]
    fn the_first_special_byte_of_a_word_is_found_exactly() {
        for text in [
            "abcdefgh",
            "ab\"defgh",
            "a\\cdefg\"",
            "abcdefg\n",
            "\u{1}bcdefgh",
            "\u{e9}\"cdefg",
            "\"\"\"\"\"\"\"\"",
        ] {
            let bytes = text.as_bytes();
            let word = u64::from_le_bytes(bytes[..8].try_into().unwrap());
            let want = bytes[..8]
                .iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\');
            let found = special(word);
            let got = (found != 0).then(|| (found.trailing_zeros() / 8) as usize);
            assert_eq!(got, want, "{text:?}");
        }
    }
}
