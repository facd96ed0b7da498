//! `.npz` / `.npy` (`vla_npz::parse_for_fuzz`): the zip container, inflate, CRC, every
//! entry's `.npy` header and data, and the bytes as a bare `.npy`; whatever parses must
//! survive a write/read round trip unchanged, and every error is one line.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vla_npz::{read_npy, Npz, NpzError};

fn assert_one_line(error: &NpzError) {
    let message = error.to_string();
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "multi-line error: {message:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    vla_npz::parse_for_fuzz(data);
    match Npz::from_bytes(data.to_vec(), "fuzz.npz") {
        Ok(npz) => {
            let names: Vec<String> = npz.names().map(str::to_string).collect();
            for name in &names {
                if let Err(e) = npz.array(name) {
                    assert_one_line(&e);
                }
            }
            if let Err(e) = npz.array("missing") {
                assert_one_line(&e);
            }
        }
        Err(e) => assert_one_line(&e),
    }
    if let Err(e) = read_npy(data, "fuzz.npy") {
        assert_one_line(&e);
    }
});
