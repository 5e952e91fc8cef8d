//! The `eve` binary.
fn main() {}
