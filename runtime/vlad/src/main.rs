//! `vlad`: the on-device VLA policy runtime daemon.
fn main() {}
