//! What can go wrong between a [`RedisStore`](super::RedisStore) and Redis.

use std::error::Error;
use std::fmt;

/// What kind of failure a [`StoreError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The URL given to [`RedisStore::connect`](super::RedisStore::connect)
    /// is not a Redis URL.
    InvalidUrl,
    /// No connection could be made (refused, unreachable, or not within the
    /// timeout).
    Connect,
    /// Redis did not answer within the store's timeout.
    Timeout,
    /// Redis answered with an error, or the connection failed mid-way.
    Redis,
    /// Redis answered something the store did not ask for (a reply of the
    /// wrong shape).
    Reply,
    /// The store is in fallback after a failure and did not ask Redis (see
    /// [`StoreMode::Fallback`](super::StoreMode::Fallback)).
    Unavailable,
    /// This key's data in Redis cannot be used (its name holds a value
    /// that is not a hash): an error of this key alone, which does not
    /// switch the store to fallback (see
    /// [`StoreStatus::key_errors`](super::StoreStatus::key_errors)).
    KeyData,
    /// The server's `maxmemory-policy` evicts keys, and the store does not
    /// decide on such a server (see
    /// [`RedisStore::allow_evicting_server`](super::RedisStore::allow_evicting_server)).
    Evicting,
}

/// A failed round trip to Redis, or one not tried because Redis is down.
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    source: Option<Box<dyn Error + Send + Sync>>,
}

impl StoreError {
    pub(crate) fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn redis(kind: StoreErrorKind, err: redis::RedisError) -> Self {
        StoreError {
            kind,
            message: err.to_string(),
            source: Some(Box::new(err)),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            StoreErrorKind::InvalidUrl => "invalid redis url",
            StoreErrorKind::Connect => "cannot connect to redis",
            StoreErrorKind::Timeout => "redis did not answer in time",
            StoreErrorKind::Redis => "redis error",
            StoreErrorKind::Reply => "unexpected reply from redis",
            StoreErrorKind::Unavailable => "redis store in fallback",
            StoreErrorKind::KeyData => "unusable key data in redis",
            StoreErrorKind::Evicting => "redis evicts keys",
        };
        if self.message.is_empty() {
            f.write_str(what)
        } else {
            write!(f, "{what}: {}", self.message)
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}
