//! Integration tests: the layer in front of gRPC services (`.grpc()`),
//! with a real tonic server and a real tonic client over loopback, and the
//! classification of gRPC completions.
//!
//! One binary for the area, one module per surface.

mod classify;
mod tonic_health;
