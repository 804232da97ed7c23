//! The tower/http glue: layer, service, response future, keys, responses.

pub(crate) mod body;
pub(crate) mod future;
pub(crate) mod key;
pub(crate) mod layer;
pub(crate) mod response;
pub(crate) mod service;
pub(crate) mod shared;
