//! Finding and loading the QNN libraries for a subcommand.
//!
//! The directory comes from `--lib-dir`, else `VLA_QNN_LIB_DIR`, else `/usr/lib` (where
//! the device image installs QAIRT).

use crate::cli::Common;
use std::path::PathBuf;
use std::sync::Arc;
use vla_qnn::{Backend, LoadOptions, QnnError, QnnLibrary};

pub const DEVICE_LIB_DIR: &str = "/usr/lib";

pub fn lib_dir(common: &Common) -> PathBuf {
    match &common.lib_dir {
        Some(d) => d.clone(),
        None => vla_qnn::lib_dir_from_env(std::path::Path::new(DEVICE_LIB_DIR)),
    }
}

pub fn load_library(common: &Common) -> Result<Arc<QnnLibrary>, QnnError> {
    let opts = LoadOptions::htp(lib_dir(common));
    Ok(Arc::new(QnnLibrary::load(&opts)?))
}

pub fn load_backend(common: &Common) -> Result<(Arc<QnnLibrary>, Backend), QnnError> {
    let lib = load_library(common)?;
    let backend = Backend::new(lib.clone())?;
    Ok((lib, backend))
}
