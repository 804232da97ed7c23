//! Where the per-key counts live.
//!
//! By default every layer keeps its counts in its own process. With the
//! `redis` feature, a `RedisStore` shares them across replicas: see the
//! `redis` module's docs for how it decides, names its keys and fails over.
//!
//! The module is public only with the `redis` feature.

// The local store is a bounded table of per-key entries (a `StatisticNode`
// and a limit each), built when it is first needed from settings that can
// still change until then.
//
// - `Store`: the settings, then the table built from them, shared by a
//   layer, its clones, its services and its handles.
// - `Registry`: the table itself: sharded, bounded by `max_keys`, evicting
//   idle keys, with one overflow entry when every slot is busy.
// - `Entry`: one key's statistics, limit and circuit breakers.
// - `TopBlocked`: the keys refused most over the last minute, in bounded
//   memory, fed by every refusal of the layer.

mod blocked;
mod cell;
mod compact;
mod entry;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
mod registry;
mod remote_slot;
mod routes;
mod windows;

#[cfg(feature = "redis")]
pub use self::redis::{
    KeyBytes, RedisStore, StoreError, StoreErrorKind, StoreFailure, StoreKey, StoreMode,
    StoreStatus, Verdict,
};

pub(crate) use blocked::{Record as RecordBlocked, TopBlocked};
pub(crate) use cell::{Settings, Store, Window, COMPACT_DEFAULT_MAX_KEYS};
pub(crate) use compact::{shape_of, CompactKeys, CompactLookup, Place, Totals};
pub(crate) use entry::{Entry, Probe};
pub(crate) use registry::{effective_now, Lookup, Registry};
#[cfg(feature = "redis")]
pub(crate) use remote_slot::RemoteLookup;
pub(crate) use remote_slot::RemoteSlot;
pub(crate) use routes::{RouteLimit, RouteOf, Routes};
pub(crate) use windows::{KeyLimits, WindowLimits};
