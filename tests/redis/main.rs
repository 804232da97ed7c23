//! Integration tests: limits shared across replicas on a real redis-server, started by the tests on a free loopback port.
//!
//! One binary for the area (as tower groups its tests), one module per surface.

#[path = "../support/redis_replica.rs"]
mod redis_replica;
#[path = "../support/redis_server.rs"]
mod redis_server;

mod cluster;
mod ipv6_prefix;
mod leases;
mod redis;
mod redis_layer;
mod windows;
