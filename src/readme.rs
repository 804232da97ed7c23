//! The README's Rust code blocks, compiled and run as doc tests.

/// The README, so that `cargo test --doc` checks that its examples compile
/// and run as written.
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
