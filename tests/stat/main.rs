//! Integration tests: the statistics core (no HTTP): buckets, windows, nodes, clocks, configuration, random sequences against a model, real-thread stress.
//!
//! One binary for the area (as tower groups its tests), one module per surface.

#[path = "../support/mod.rs"]
mod support;

mod array_metric;
mod clock;
mod config;
mod leap_array;
mod proptest;
mod statistic_node;
mod stress;
