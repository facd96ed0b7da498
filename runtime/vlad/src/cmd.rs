//! One module per subcommand (`vlad <command>` is `cmd::<command>`, dashes as
//! underscores): its command line and the work that is the command's alone. What the
//! commands share with the daemon (loading and gating a bundle, the DSP memory plan, QNN
//! set-up) lives in the crate's other modules; `vlad run`'s daemon in `daemon`.

pub mod bench_bundle;
pub mod bench_context;
pub mod bundle;
pub mod dsp_probe;
pub mod inspect;
pub mod ota;
pub mod parity;
pub mod plan;
pub mod prompt;
pub mod replay;
pub mod run_once;
pub mod simulate;
