//! Safe binding to Qualcomm's QNN (HTP backend), loaded at run time.
//!
//! Layers, bottom up: [`ffi`] declares the C ABI by hand; [`QnnLibrary`] `dlopen`s
//! libQnnHtp.so and libQnnSystem.so and picks providers by API version; [`Backend`] owns
//! the log, backend and device handles; [`ContextBinary`] maps a `.bin` read-only and
//! reads its graphs and tensors through libQnnSystem; [`Context`] makes it resident and
//! hands out [`Graph`]s whose `execute` checks every buffer against the tensor metadata
//! before QNN sees it; [`create_contexts`] makes a bundle's contexts share one spill-fill
//! buffer when their binaries need one; [`MemoryPlan`] places contexts in cDSP sessions
//! and NSPs under a budget before anything is created; [`PerfGovernor`] votes for HTP
//! performance around inferences; [`RpcMem`] and [`SharedBuffer`] give graphs rpcmem
//! memory registered with their context ([`Graph::bind_shared`]), which the HTP uses in
//! place.
//! Nothing here knows about policies.
//!
//! ```no_run
//! use std::sync::Arc;
//! use vla_qnn::{Backend, Context, ContextBinary, LoadOptions, QnnLibrary};
//! let lib = Arc::new(QnnLibrary::load(&LoadOptions::htp("/usr/lib"))?);
//! let backend = Backend::new(lib.clone())?;
//! let binary = ContextBinary::open(&lib, "ctx/vision_socid77_archv73.bin")?;
//! let mut graph = Context::create(&backend, binary)?.graph(None)?;
//! let mut io = graph.allocate_io();
//! graph.execute_io(&mut io)?;
//! # Ok::<(), vla_qnn::QnnError>(())
//! ```

// `unsafe` only in the FFI modules, each of which allows it at its top.
#![deny(unsafe_code)]

mod backend;
mod binary;
mod context;
mod error;
pub mod ffi;
mod group;
mod library;
mod load_output;
mod mem;
mod memory_plan;
mod perf;
mod platform;
mod release;
pub mod rpcmem;

pub use backend::{Backend, ContextPlacement};
pub use binary::{
    data_type_name, BinaryImage, BinaryInfo, ContextBinary, GraphInfo, ImageCensus, TakeBytes,
    TensorInfo, TensorKind,
};
pub use context::{Context, Graph, IoBuffers, SharedLayout};
pub use error::{error_meaning, HtpRefusal, QnnError};
pub use group::{
    create_contexts, create_contexts_sharing, shared_spill_fill, ContextGroup, GroupError,
    SpillFillSharing,
};
pub use library::{
    ApiVersion, LoadOptions, QnnLibrary, NEWEST_KNOWN_CORE_API, NEWEST_KNOWN_SYSTEM_API,
};
pub use mem::{align_region, Region, SharedBuffer, REGION_ALIGN};
pub use memory_plan::{
    mib, Footprint, Group, MemoryPlan, Placement, PlanError, PlannedSession, DEFAULT_RESERVE_BYTES,
    DEFAULT_SESSION_BUDGET, MIB, SESSION_USABLE_BYTES,
};
pub use perf::{
    InferenceVote, PerfGovernor, PerformanceMode, PerformanceVote, PowerConfigList, VoteStats,
};
pub use platform::{CoreReport, DeviceReport, DeviceSelection, PlatformInfo};
pub use release::{Coupling, QairtRelease};
pub use rpcmem::RpcMem;
