//! `vlad.json` (`vla_config::Config::from_json`): any bytes end in a configuration or in a
//! one-line error, never a panic, and an accepted configuration keeps its documented
//! ranges.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vla_config::Config;

fuzz_target!(|data: &[u8]| {
    match Config::from_json(data) {
        Ok(config) => {
            // The validated ranges that the daemon relies on without checking again.
            let hz = config.control.publish_hz;
            assert!(hz > 0.0 && hz <= 1000.0, "publish_hz {hz} accepted");
            assert!(config.rings.action_slots.is_power_of_two());
            assert!(config.qnn.lib_dir.starts_with('/'));
            let _ = config.control.publish_period();
        }
        Err(error) => {
            let message = error.to_string();
            assert!(!message.is_empty());
            assert!(
                !message.contains('\n') && !message.contains('\r'),
                "multi-line error: {message:?}"
            );
        }
    }
});
