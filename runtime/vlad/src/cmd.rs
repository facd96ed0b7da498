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
pub mod run;
pub mod run_once;
pub mod simulate;

use crate::cli::Common;
use crate::{qnn_setup, Failure};
use std::path::Path;
use std::time::Instant;
use vla_policy::{Bundle, Policy};

/// A bundle opened and its policy loaded, without the daemon's gate (the commands that
/// run it report parity themselves).
pub(crate) struct Opened {
    /// The bundle.
    pub bundle: Bundle,
    /// Its policy, every context created.
    pub policy: Policy,
    /// How long the contexts took to load, in ms.
    pub load_ms: f64,
}

/// Opens the bundle in `dir` and loads its policy on a backend from `common`'s QNN
/// library.
pub(crate) fn load(common: &Common, dir: &Path) -> Result<Opened, Failure> {
    let bundle = Bundle::open(dir)?;
    let (_, backend) = qnn_setup::load_backend(common)?;
    let t = Instant::now();
    let policy = Policy::load(&bundle, &backend)?;
    crate::gate::note_upstream_deviations(&bundle);
    Ok(Opened {
        bundle,
        policy,
        load_ms: t.elapsed().as_secs_f64() * 1e3,
    })
}
