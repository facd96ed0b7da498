//! A fault-injecting QNN backend library, for tests only: loaded in place of
//! `libQnnHtp.so` (it exports `QnnInterface_getProviders`), it loads the real library,
//! copies each provider's header and function table and substitutes wrappers for the
//! calls a board sees fail; every call is forwarded to the real function unless the
//! rules file (`$VLA_QNN_FAULTS`, see [`rules`]) says otherwise. The real library's path
//! is the rules file's `real` line or `$VLA_QNN_FAULTS_REAL`.
//!
//! Each injected fault is written to stderr as one line (`vla-qnn-faults: graphExecute
//! call 12: 1007`), so a test reads what was injected next to what the client logged.
//! Never built into the image: the daemon's binary does not depend on it.

pub mod rules;

use rules::{Func, Outcome, Plan};
use std::ffi::{c_char, c_void, CString};
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

/// The rules file's environment variable.
pub const RULES_ENV: &str = "VLA_QNN_FAULTS";
/// The real backend library's environment variable (the rules file's `real` wins).
pub const REAL_ENV: &str = "VLA_QNN_FAULTS_REAL";

type Handle = *mut c_void;
type BackendCreateFn = unsafe extern "C" fn(Handle, *const *const c_void, *mut Handle) -> u64;
type FreeFn = unsafe extern "C" fn(Handle) -> u64;
type ContextCreateFn = unsafe extern "C" fn(
    Handle,
    Handle,
    *const *const c_void,
    *const c_void,
    u64,
    *mut Handle,
    Handle,
) -> u64;
type ContextFreeFn = unsafe extern "C" fn(Handle, Handle) -> u64;
type GraphRetrieveFn = unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> u64;
type GraphExecuteFn =
    unsafe extern "C" fn(Handle, *const c_void, u32, *mut c_void, u32, Handle, Handle) -> u64;
type GetInfraFn = unsafe extern "C" fn(*mut *const c_void) -> u64;
type DeviceCreateFn = unsafe extern "C" fn(Handle, *const *const c_void, *mut Handle) -> u64;
type CreatePowerIdFn = unsafe extern "C" fn(u32, u32, *mut u32) -> u64;
type SetPowerFn = unsafe extern "C" fn(u32, *const *const c_void) -> u64;
type GetProvidersFn = unsafe extern "C" fn(*mut *const *const c_void, *mut u32) -> u64;

/// `QnnInterface_t`: the header (backendId, name, API versions) is 40 bytes, slot `i` of
/// the function table at `40 + 8 i`; the core API 2.40 of QNN 2.51 has more than 71 slots
/// (docs/qnn-abi.md), so that much is copied, and only from a provider whose header says
/// its table is that long.
const HEADER: usize = 40;
const SLOTS: usize = 71;
const PROVIDER_BYTES: usize = HEADER + 8 * SLOTS;
/// Oldest core API minor (of 2.x) whose table was checked to hold `SLOTS` slots.
const MIN_CORE_MINOR: u32 = 40;
/// Slots substituted.
mod slot {
    pub const BACKEND_CREATE: usize = 1;
    pub const BACKEND_FREE: usize = 8;
    pub const CONTEXT_CREATE_FROM_BINARY: usize = 13;
    pub const CONTEXT_FREE: usize = 14;
    pub const GRAPH_RETRIEVE: usize = 20;
    pub const GRAPH_EXECUTE: usize = 21;
    pub const DEVICE_GET_INFRASTRUCTURE: usize = 39;
    pub const DEVICE_CREATE: usize = 40;
    pub const DEVICE_FREE: usize = 43;
}
/// The HTP PERF infrastructure struct: infraType @0, createPowerConfigId @8,
/// destroyPowerConfigId @16, setPowerConfig @24, setMemoryConfig @32 (docs/qnn-abi.md).
const INFRA_BYTES: usize = 40;
const INFRA_CREATE: usize = 8;
const INFRA_SET: usize = 24;

/// The real functions behind the substituted slots (one real provider: the first).
struct Real {
    backend_create: BackendCreateFn,
    backend_free: FreeFn,
    context_create: ContextCreateFn,
    context_free: ContextFreeFn,
    graph_retrieve: GraphRetrieveFn,
    graph_execute: GraphExecuteFn,
    get_infra: GetInfraFn,
    device_create: DeviceCreateFn,
    device_free: FreeFn,
}

/// What `QnnInterface_getProviders` hands out, built once.
struct Providers {
    /// Leaked copies (alive for the process, as the real library's are while loaded).
    list: Vec<usize>,
    real: Real,
}

/// The infrastructure copy with our power functions, and the real ones.
struct Infra {
    copy: usize,
    create: CreatePowerIdFn,
    set: SetPowerFn,
}

static PROVIDERS: OnceLock<Result<Providers, String>> = OnceLock::new();
static INFRA: OnceLock<Option<Infra>> = OnceLock::new();
static PLAN: Mutex<State> = Mutex::new(State {
    plan: None,
    read: None,
});

struct State {
    plan: Option<Plan>,
    /// The rules file's modification time when last read.
    read: Option<SystemTime>,
}

fn say(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "vla-qnn-faults: {line}");
}

/// Re-reads the rules file if it changed; the plan (empty without a file).
fn refresh(state: &mut State) -> &mut Plan {
    let plan = state.plan.get_or_insert_with(Plan::default);
    let Some(path) = std::env::var_os(RULES_ENV) else {
        return plan;
    };
    let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    if modified.is_some() && modified != state.read {
        state.read = modified;
        match std::fs::read_to_string(&path).map_err(|e| e.to_string()) {
            Ok(text) => match plan.load(&text) {
                Ok(()) => say(format_args!("rules from {}", path.to_string_lossy())),
                Err(e) => say(format_args!("{}: {e}", path.to_string_lossy())),
            },
            Err(e) => say(format_args!("{}: {e}", path.to_string_lossy())),
        }
    }
    plan
}

fn lock() -> std::sync::MutexGuard<'static, State> {
    PLAN.lock().unwrap_or_else(|p| p.into_inner())
}

/// CLOCK_MONOTONIC in ns (the clock the rings' times use): a test matches an injected
/// fault against the actions published around it.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Counts the call and applies its outcome; `Some(code)` to return instead of forwarding.
fn intercept(f: Func, handle: usize) -> Option<u64> {
    let (n, outcome) = refresh(&mut lock()).decide(f, handle);
    match outcome {
        Outcome::Forward => None,
        Outcome::Fail(code) => {
            say(format_args!(
                "{} call {n}: {code} at {} ns",
                f.name(),
                monotonic_ns()
            ));
            Some(code)
        }
        Outcome::Block(d, code) => {
            say(format_args!(
                "{} call {n}: blocking {} ms at {} ns",
                f.name(),
                d.as_millis(),
                monotonic_ns()
            ));
            // Outside the lock: other threads' calls go on meanwhile.
            std::thread::sleep(d);
            code
        }
    }
}

fn with_plan(f: impl FnOnce(&mut Plan)) {
    f(refresh(&mut lock()));
}

fn real() -> Option<&'static Real> {
    PROVIDERS
        .get()
        .and_then(|p| p.as_ref().ok())
        .map(|p| &p.real)
}

/// `QNN_COMMON_ERROR_GENERAL`: a call through a table that was never built.
const GENERAL: u64 = 1100;

unsafe extern "C" fn backend_create(
    log: Handle,
    cfg: *const *const c_void,
    out: *mut Handle,
) -> u64 {
    let Some(r) = real() else { return GENERAL };
    if let Some(code) = intercept(Func::BackendCreate, 0) {
        return code;
    }
    // SAFETY: the real backendCreate with the caller's arguments, unchanged.
    let rc = unsafe { (r.backend_create)(log, cfg, out) };
    if rc == 0 {
        with_plan(|p| p.backend_event(true));
    }
    rc
}

unsafe extern "C" fn backend_free(backend: Handle) -> u64 {
    let Some(r) = real() else { return GENERAL };
    if let Some(code) = intercept(Func::BackendFree, backend as usize) {
        return code;
    }
    // SAFETY: the real backendFree with the caller's handle.
    let rc = unsafe { (r.backend_free)(backend) };
    with_plan(|p| p.backend_event(false));
    rc
}

unsafe extern "C" fn context_create_from_binary(
    backend: Handle,
    device: Handle,
    cfg: *const *const c_void,
    buf: *const c_void,
    size: u64,
    ctx: *mut Handle,
    profile: Handle,
) -> u64 {
    let Some(r) = real() else { return GENERAL };
    if let Some(code) = intercept(Func::ContextCreateFromBinary, 0) {
        return code;
    }
    // SAFETY: the real contextCreateFromBinary with the caller's arguments, unchanged.
    let rc = unsafe { (r.context_create)(backend, device, cfg, buf, size, ctx, profile) };
    if rc == 0 && !ctx.is_null() {
        // SAFETY: on success the real function wrote the caller's out-pointer, non-NULL.
        let created = unsafe { ctx.read() } as usize;
        with_plan(|p| p.context_created(created));
    }
    rc
}

unsafe extern "C" fn context_free(ctx: Handle, profile: Handle) -> u64 {
    let Some(r) = real() else { return GENERAL };
    if let Some(code) = intercept(Func::ContextFree, ctx as usize) {
        return code;
    }
    // SAFETY: the real contextFree with the caller's arguments.
    let rc = unsafe { (r.context_free)(ctx, profile) };
    with_plan(|p| p.context_freed(ctx as usize));
    rc
}

unsafe extern "C" fn graph_retrieve(ctx: Handle, name: *const c_char, graph: *mut Handle) -> u64 {
    let Some(r) = real() else { return GENERAL };
    if let Some(code) = intercept(Func::GraphRetrieve, ctx as usize) {
        return code;
    }
    // SAFETY: the real graphRetrieve with the caller's arguments, unchanged.
    let rc = unsafe { (r.graph_retrieve)(ctx, name, graph) };
    if rc == 0 && !graph.is_null() {
        // SAFETY: on success the real function wrote the caller's out-pointer, non-NULL.
        let g = unsafe { graph.read() } as usize;
        with_plan(|p| p.graph_retrieved(g, ctx as usize));
    }
    rc
}

unsafe extern "C" fn graph_execute(
    graph: Handle,
    inputs: *const c_void,
    n_in: u32,
    outputs: *mut c_void,
    n_out: u32,
    profile: Handle,
    signal: Handle,
) -> u64 {
    let Some(r) = real() else { return GENERAL };
    if let Some(code) = intercept(Func::GraphExecute, graph as usize) {
        return code;
    }
    // SAFETY: the real graphExecute with the caller's arguments, unchanged.
    unsafe { (r.graph_execute)(graph, inputs, n_in, outputs, n_out, profile, signal) }
}

unsafe extern "C" fn device_create(
    log: Handle,
    cfg: *const *const c_void,
    out: *mut Handle,
) -> u64 {
    let Some(r) = real() else { return GENERAL };
    if let Some(code) = intercept(Func::DeviceCreate, 0) {
        return code;
    }
    // SAFETY: the real deviceCreate with the caller's arguments, unchanged.
    unsafe { (r.device_create)(log, cfg, out) }
}

unsafe extern "C" fn device_free(device: Handle) -> u64 {
    let Some(r) = real() else { return GENERAL };
    if let Some(code) = intercept(Func::DeviceFree, device as usize) {
        return code;
    }
    // SAFETY: the real deviceFree with the caller's handle.
    unsafe { (r.device_free)(device) }
}

unsafe extern "C" fn create_power_config_id(device: u32, core: u32, id: *mut u32) -> u64 {
    let Some(Some(i)) = INFRA.get() else {
        return GENERAL;
    };
    if let Some(code) = intercept(Func::CreatePowerConfigId, 0) {
        return code;
    }
    // SAFETY: the real createPowerConfigId with the caller's arguments.
    unsafe { (i.create)(device, core, id) }
}

unsafe extern "C" fn set_power_config(id: u32, configs: *const *const c_void) -> u64 {
    let Some(Some(i)) = INFRA.get() else {
        return GENERAL;
    };
    if let Some(code) = intercept(Func::SetPowerConfig, 0) {
        return code;
    }
    // SAFETY: the real setPowerConfig with the caller's arguments.
    unsafe { (i.set)(id, configs) }
}

/// Copies the real PERF infrastructure struct once with our two power functions in it.
/// Only its first 40 bytes (the fields docs/qnn-abi.md documents) are copied: a client that
/// reads further reads zeros.
fn wrap_infra(real_infra: *const c_void) -> Option<Infra> {
    if real_infra.is_null() {
        return None;
    }
    let base = real_infra as *const u8;
    // SAFETY: the struct QNN returned has the documented 40 bytes (infraType and four
    // function pointers), alive while the real library is loaded (for the process).
    let bytes: [u8; INFRA_BYTES] = unsafe { (base as *const [u8; INFRA_BYTES]).read_unaligned() };
    let create = read_fn(&bytes, INFRA_CREATE)?;
    let set = read_fn(&bytes, INFRA_SET)?;
    // SAFETY: a non-NULL createPowerConfigId pointer from QNN's own struct, whose type
    // docs/qnn-abi.md documents as `(u32, u32, u32*) -> u64`.
    let create: CreatePowerIdFn = unsafe { std::mem::transmute::<usize, CreatePowerIdFn>(create) };
    // SAFETY: as above, setPowerConfig `(u32, const PowerConfig**) -> u64`.
    let set: SetPowerFn = unsafe { std::mem::transmute::<usize, SetPowerFn>(set) };
    let mut copy = Box::new(bytes);
    put(
        &mut copy[..],
        INFRA_CREATE,
        create_power_config_id as *const () as usize,
    );
    put(
        &mut copy[..],
        INFRA_SET,
        set_power_config as *const () as usize,
    );
    Some(Infra {
        copy: Box::leak(copy).as_ptr() as usize,
        create,
        set,
    })
}

unsafe extern "C" fn device_get_infrastructure(out: *mut *const c_void) -> u64 {
    let Some(r) = real() else { return GENERAL };
    if let Some(code) = intercept(Func::DeviceGetInfrastructure, 0) {
        return code;
    }
    let mut real_infra: *const c_void = std::ptr::null();
    // SAFETY: the real deviceGetInfrastructure writing a local.
    let rc = unsafe { (r.get_infra)(&mut real_infra) };
    if rc != 0 || out.is_null() {
        return rc;
    }
    let ours = INFRA.get_or_init(|| wrap_infra(real_infra));
    let handed = ours
        .as_ref()
        .map_or(real_infra, |i| i.copy as *const c_void);
    // SAFETY: the caller's out-pointer, checked non-NULL.
    unsafe { out.write(handed) };
    rc
}

fn read_fn(bytes: &[u8], at: usize) -> Option<usize> {
    let raw: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
    Some(usize::from_ne_bytes(raw)).filter(|&p| p != 0)
}

fn put(bytes: &mut [u8], at: usize, value: usize) {
    bytes[at..at + 8].copy_from_slice(&value.to_ne_bytes());
}

/// The real function pointer in slot `i` of a copied table, as type `F`.
///
/// # Safety
/// Slot `i` of a QNN core 2.x table holds a function of type `F` (docs/qnn-abi.md's order).
unsafe fn slot_fn<F: Copy>(table: &[u8], i: usize) -> Result<F, String> {
    let p = read_fn(table, HEADER + 8 * i).ok_or_else(|| format!("slot {i} is NULL"))?;
    // SAFETY: the caller's contract: a function pointer of type `F`, the size of usize.
    Ok(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
}

/// Loads the real library and builds the wrapped providers.
fn build() -> Result<Providers, String> {
    let rules_real = refresh(&mut lock()).real.clone();
    let path = rules_real
        .or_else(|| std::env::var(REAL_ENV).ok())
        .ok_or_else(|| format!("no real library: set {REAL_ENV} or a `real` rule"))?;
    let c_path = CString::new(path.clone()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen with a NUL-terminated path; the handle is kept for the process.
    let lib = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return Err(format!("cannot load {path}"));
    }
    // SAFETY: dlsym on the handle just opened with a NUL-terminated name.
    let sym = unsafe { libc::dlsym(lib, c"QnnInterface_getProviders".as_ptr()) };
    if sym.is_null() {
        return Err(format!("{path} has no QnnInterface_getProviders"));
    }
    // SAFETY: QNN's documented entry point `(const QnnInterface_t***, u32*) -> u64`.
    let get: GetProvidersFn = unsafe { std::mem::transmute::<*mut c_void, GetProvidersFn>(sym) };
    let mut list: *const *const c_void = std::ptr::null();
    let mut n = 0u32;
    // SAFETY: the real entry point writing two locals.
    let rc = unsafe { get(&mut list, &mut n) };
    if rc != 0 || list.is_null() || n == 0 {
        return Err(format!(
            "{path}: QnnInterface_getProviders returned {rc}, {n} providers"
        ));
    }
    let mut copies = Vec::new();
    let mut real = None;
    for i in 0..n as usize {
        // SAFETY: `list` holds `n` provider pointers, owned by the loaded library.
        let at_i = unsafe { list.add(i) };
        // SAFETY: inside the list, as above.
        let p = unsafe { at_i.read() } as *const u8;
        // SAFETY: every QNN provider starts with the 40-byte header (docs/qnn-abi.md).
        let header: [u8; HEADER] = unsafe { (p as *const [u8; HEADER]).read_unaligned() };
        let word =
            |at: usize| u32::from_ne_bytes(header[at..at + 4].try_into().unwrap_or_default());
        let (major, minor) = (word(16), word(20));
        if major != 2 || minor < MIN_CORE_MINOR {
            return Err(format!(
                "{path}: provider {i} has core API {major}.{minor}, not 2.{MIN_CORE_MINOR} or a later 2.x (whose table was checked to hold {SLOTS} slots)"
            ));
        }
        // SAFETY: the header just read says core API 2.40 or later, whose table holds at
        // least `SLOTS` slots after the header.
        let bytes: [u8; PROVIDER_BYTES] =
            unsafe { (p as *const [u8; PROVIDER_BYTES]).read_unaligned() };
        if real.is_none() {
            // docs/qnn-abi.md's slot order for core API 2.x.
            real = Some(Real {
                // SAFETY: slot 1 backendCreate.
                backend_create: unsafe { slot_fn(&bytes, slot::BACKEND_CREATE) }?,
                // SAFETY: slot 8 backendFree.
                backend_free: unsafe { slot_fn(&bytes, slot::BACKEND_FREE) }?,
                // SAFETY: slot 13 contextCreateFromBinary.
                context_create: unsafe { slot_fn(&bytes, slot::CONTEXT_CREATE_FROM_BINARY) }?,
                // SAFETY: slot 14 contextFree.
                context_free: unsafe { slot_fn(&bytes, slot::CONTEXT_FREE) }?,
                // SAFETY: slot 20 graphRetrieve.
                graph_retrieve: unsafe { slot_fn(&bytes, slot::GRAPH_RETRIEVE) }?,
                // SAFETY: slot 21 graphExecute.
                graph_execute: unsafe { slot_fn(&bytes, slot::GRAPH_EXECUTE) }?,
                // SAFETY: slot 39 deviceGetInfrastructure.
                get_infra: unsafe { slot_fn(&bytes, slot::DEVICE_GET_INFRASTRUCTURE) }?,
                // SAFETY: slot 40 deviceCreate.
                device_create: unsafe { slot_fn(&bytes, slot::DEVICE_CREATE) }?,
                // SAFETY: slot 43 deviceFree.
                device_free: unsafe { slot_fn(&bytes, slot::DEVICE_FREE) }?,
            });
        }
        let mut copy = Box::new(bytes);
        let t = &mut copy[..];
        let at = |s: usize| HEADER + 8 * s;
        put(
            t,
            at(slot::BACKEND_CREATE),
            backend_create as *const () as usize,
        );
        put(
            t,
            at(slot::BACKEND_FREE),
            backend_free as *const () as usize,
        );
        put(
            t,
            at(slot::CONTEXT_CREATE_FROM_BINARY),
            context_create_from_binary as *const () as usize,
        );
        put(
            t,
            at(slot::CONTEXT_FREE),
            context_free as *const () as usize,
        );
        put(
            t,
            at(slot::GRAPH_RETRIEVE),
            graph_retrieve as *const () as usize,
        );
        put(
            t,
            at(slot::GRAPH_EXECUTE),
            graph_execute as *const () as usize,
        );
        put(
            t,
            at(slot::DEVICE_GET_INFRASTRUCTURE),
            device_get_infrastructure as *const () as usize,
        );
        put(
            t,
            at(slot::DEVICE_CREATE),
            device_create as *const () as usize,
        );
        put(t, at(slot::DEVICE_FREE), device_free as *const () as usize);
        copies.push(Box::leak(copy).as_ptr() as usize);
    }
    say(format_args!("wrapping {path} ({n} providers)"));
    Ok(Providers {
        list: copies,
        real: real.ok_or("no provider")?,
    })
}

/// QNN's entry point: the real library's providers with the wrapped table.
///
/// # Safety
/// `providers` and `n` are writable pointers, as QNN's contract requires.
#[no_mangle]
pub unsafe extern "C" fn QnnInterface_getProviders(
    providers: *mut *const *const c_void,
    n: *mut u32,
) -> u64 {
    match PROVIDERS.get_or_init(build) {
        Ok(p) => {
            if providers.is_null() || n.is_null() {
                return 1004;
            }
            // SAFETY: the caller's out-pointer, checked non-NULL; the list is leaked
            // (alive for the process).
            unsafe { providers.write(p.list.as_ptr() as *const *const c_void) };
            // SAFETY: the caller's out-pointer, checked non-NULL.
            unsafe { n.write(p.list.len() as u32) };
            0
        }
        Err(e) => {
            say(format_args!("{e}"));
            // QNN_COMMON_ERROR_LOADING_BINARIES
            1009
        }
    }
}
