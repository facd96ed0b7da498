//! `Config::from_json` must survive any bytes (it will run as a fuzz target): every
//! truncation and many single-byte mutations of the examples, plus hostile shapes,
//! must end in `Ok` or a one-line error, never a panic.

mod common;

use vla_config::Config;

fn check(bytes: &[u8]) {
    if let Err(error) = Config::from_json(bytes) {
        let message = error.to_string();
        assert!(
            !message.contains('\n') && !message.contains('\r'),
            "multi-line message for {:?}: {message}",
            String::from_utf8_lossy(bytes)
        );
    }
}

/// Bytes that change the JSON structure or the parser's path through it.
const MUTANTS: &[u8] = b"\"{}[],:\\0-9e.ntf \x00\xff\xc3";

#[test]
fn truncations_never_panic() {
    for json in [common::device_json(), common::dev_json()] {
        let bytes = json.as_bytes();
        for end in 0..=bytes.len() {
            check(&bytes[..end]);
            check(&bytes[end..]);
        }
    }
}

#[test]
fn single_byte_mutations_never_panic() {
    for json in [common::device_json(), common::dev_json()] {
        let bytes = json.as_bytes();
        let mut mutated = bytes.to_vec();
        for position in 0..bytes.len() {
            for &mutant in MUTANTS {
                mutated[position] = mutant;
                check(&mutated);
            }
            mutated[position] = bytes[position];
        }
        // Deletions and duplications shift everything after them.
        for position in 0..bytes.len() {
            let mut deleted = bytes.to_vec();
            deleted.remove(position);
            check(&deleted);
            let mut doubled = bytes.to_vec();
            doubled.insert(position, bytes[position]);
            check(&doubled);
        }
    }
}

#[test]
fn hostile_shapes_never_panic() {
    let deep_array = format!("{}{}", "[".repeat(8000), "]".repeat(8000));
    let deep_object = "{\"qnn\":".repeat(2000);
    let deep_in_field = format!("{{\"qnn\": {{\"lib_dir\": {}", "[".repeat(15000));
    let deep_in_list = common::device_json().replace("[4, 5, 6, 7]", &"[".repeat(10000));
    let long_key = format!("{{\"{}\": 1}}", "k".repeat(10000));
    let multibyte_key = format!("{{\"{}\": 1}}", "é".repeat(3000));
    let escaped = format!(
        "{{\"qnn\": {{\"lib_dir\": \"{}\"}}}}",
        "\\u00e9".repeat(1000)
    );
    let control_chars = "{\"q\nn\u{7}\": 1}".to_string();
    let bad_escape = "{\"qnn\": {\"lib_dir\": \"\\x\"}}".to_string();
    let lone_surrogate = "{\"qnn\": {\"lib_dir\": \"\\ud800\"}}".to_string();
    let huge_number = common::device_json().replace("20.0", &"9".repeat(5000));
    let many_keys = format!(
        "{{\"ota\": {{\"trusted_keys\": [{}]}}}}",
        vec!["\"é\""; 2000].join(",")
    );
    for input in [
        deep_array,
        deep_object,
        deep_in_field,
        deep_in_list,
        long_key,
        multibyte_key,
        escaped,
        control_chars,
        bad_escape,
        lone_surrogate,
        huge_number,
        many_keys,
    ] {
        check(input.as_bytes());
    }
    for bytes in [
        &b"\xff\xfe{}"[..],
        b"{\"\xff\": 1}",
        b"\x00",
        b"nul",
        b"{,}",
        b"[,]",
    ] {
        check(bytes);
    }
}

#[test]
fn pseudo_random_byte_strings_never_panic() {
    // A fixed xorshift sequence: reproducible, no extra dependency.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let alphabet = b"{}[]\":,0123456789.-eEtruefalsnl \\u\n\xc3\xa9abc_";
    for _ in 0..3000 {
        let len = (next() % 200) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
            .collect();
        check(&bytes);
    }
}
