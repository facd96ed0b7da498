//! Links GCC's unwinder statically: Rust's std asks the linker for `-lgcc_s`, which would
//! make libgcc_s.so.1 the one non-glibc library vlad needs at start. `link/libgcc_s.so` is
//! a linker script naming the static `libgcc_eh.a` instead, found first on this path.
fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("link");
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rerun-if-changed=link/libgcc_s.so");
}
