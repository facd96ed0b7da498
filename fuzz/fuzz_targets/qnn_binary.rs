//! QNN context-binary metadata (`QnnLibrary::inspect_bytes`: the bytes go through
//! libQnnSystem's `systemContextGetBinaryInfo`, then `read_binary_info` copies what the
//! library reports into our types): any bytes end in metadata we can act on or in a
//! one-line error, never a panic or a wild read.
//!
//! Needs the real libraries: `VLA_QNN_LIB_DIR` (scripts/fuzz.sh sets it from
//! scripts/qnn_lib_dir.sh). They are loaded once per process.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use vla_qnn::{LoadOptions, QnnLibrary};

fn library() -> &'static QnnLibrary {
    static LIBRARY: OnceLock<QnnLibrary> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let dir = std::env::var_os("VLA_QNN_LIB_DIR")
            .filter(|d| !d.is_empty())
            .expect("set VLA_QNN_LIB_DIR to the QNN library directory (scripts/qnn_lib_dir.sh)");
        QnnLibrary::load(&LoadOptions::htp(dir)).unwrap_or_else(|e| panic!("{e}"))
    })
}

fuzz_target!(|data: &[u8]| {
    match library().inspect_bytes(data, "fuzz.bin") {
        Ok(info) => {
            assert!(!info.graphs.is_empty());
            for graph in &info.graphs {
                for tensor in graph.inputs.iter().chain(&graph.outputs) {
                    assert!(tensor.dims.len() <= 16, "rank {}", tensor.dims.len());
                    assert_eq!(tensor.element.is_none(), tensor.unsupported.is_some());
                    let _ = (tensor.shape_text(), tensor.byte_len());
                }
            }
        }
        Err(error) => {
            let message = error.to_string();
            assert!(
                !message.contains('\n') && !message.contains('\r'),
                "multi-line error: {message:?}"
            );
        }
    }
});
