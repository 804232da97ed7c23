//! Where the per-key counts live.
//!
//! The local store is a bounded table of per-key entries (a
//! [`StatisticNode`](crate::stat::StatisticNode) and a limit each), built
//! when it is first needed from settings that can still change until then.
//!
//! - [`Store`]: the settings, then the table built from them, shared by a
//!   layer, its clones, its services and its handles.
//! - [`Registry`]: the table itself: sharded, bounded by `max_keys`,
//!   evicting idle keys, with one overflow entry when every slot is busy.
//! - [`Entry`]: one key's statistics, limit and circuit breakers.

mod cell;
mod entry;
mod registry;

pub(crate) use cell::{Settings, Store, Window};
pub(crate) use entry::{Entry, Probe};
pub(crate) use registry::{effective_now, Lookup, Registry};
