//! Limits shared across replicas, kept in Redis (feature `redis`).
//!
//! A [`RedisStore`] decides each admission in Redis, in one atomic step: a
//! Lua script (loaded once, then called by its hash with `EVALSHA`, and
//! loaded again if the server answers `NOSCRIPT`, after a restart) reads
//! the key's buckets, checks `passes + n <= limit` and records the pass.
//! Any number of replicas that share the Redis and the same limits admit
//! at most `limit` per window in total, and exactly `limit` under
//! overload.
//!
//! # The window
//!
//! The same bucketed window as the local layer: `sample_count` buckets of
//! `interval / sample_count` ms; admission counts the passes of the
//! buckets whose starts lie in the last `interval`, and with
//! [`strict`](RedisStore::strict) one bucket more. Each key is one Redis
//! hash from bucket start to passes; buckets that have left the window are
//! deleted as the script meets them.
//!
//! **One time source.** Bucket boundaries come from the Redis server's
//! clock (`TIME`, read inside the script), never from a replica's: a
//! replica whose clock is off cannot move a window edge, so clock skew
//! between replicas cannot over-admit. Tests that need exact edges give
//! the store a [`ManualClock`](crate::clock::ManualClock) with
//! [`clock`](RedisStore::clock): its time is then sent with every call
//! instead (every replica must then share that clock).
//!
//! # Few round trips
//!
//! One round trip per request at most, and far fewer for a hot key (see
//! below). A refusal carries the time until a pass could fit; the store
//! then refuses that key locally, without a round trip, until that time
//! (on its own clock). At most 4096 keys are remembered this way; beyond
//! that a refused key costs its round trip. Concurrent calls share the one
//! multiplexed connection: the client writes them back to back without
//! waiting for each answer (pipelining), and Redis answers them in order.
//!
//! # Several windows
//!
//! A layer with further windows per key (`SlidingWindowLayer::limit_per`)
//! has every window of a key decided in the same script call, atomically:
//! the script reads each window's buckets, checks each window's passes
//! against its limit, and records the pass in every window or in none. A
//! request one window refuses is charged to no window in Redis, and a
//! refusal waits the longest among the windows. Each call sends the
//! caller's limit for the key in each further window (the window's
//! default, or the key's own from `rule_per` or `set_limit_per`); a shared
//! limit in Redis ([`set_limit`](RedisStore::set_limit)) is the first
//! window's. A pass Redis grants must fit every window of the replica's
//! own, charged to all or none. A key with further windows never leases
//! (below), nor has its queued requests decided together: each of its
//! requests is one script call. (A lease is recorded in the current bucket
//! of the call and spent until the first window's bucket ends; a further
//! window's buckets need not end when the first's do, and a pass spent
//! after one of them ended would be counted in a bucket that leaves that
//! window too early.)
//!
//! # Leases for hot keys
//!
//! A key this replica admits often takes several passes of the current
//! bucket in one round trip: the script grants them, up to the room left
//! under the limit, and records them all at once as passes of that bucket,
//! so the window's count in Redis is never below what the replicas admit.
//! The replica spends them on its next requests for the key with no round
//! trip, and only before the bucket ends on the server's clock (a deadline
//! taken from the call's send time, which errs early). Passes not spent by
//! then are never given back: they stay counted in Redis (so they can
//! only refuse more) and expire with the bucket ([`StoreStatus::stranded`]).
//! So every bucket-aligned window still holds at most `limit` admissions,
//! across any number of replicas and in any order of calls and answers.
//!
//! The size of a lease follows the key's rate on this replica (its
//! requests in the last 100 ms) and the measured round trip: about what
//! the key needs over 16 round trips (at most 12.5 ms), no more than the
//! part of the bucket left brings, no more than the room left, and at most
//! `limit / (span * 32)` passes (`span`: the buckets a window counts). A
//! key needs 160 requests a second for a lease of two; any other asks for
//! one pass per request, as before. A limit under `64 * span` (640 on the
//! default window) never leases. The pool is refilled in the background
//! before it runs out. While a call for a key is in flight, this
//! replica's requests for the key that find no leased pass wait for it
//! (at most the store's timeout), and the next call asks for all of them:
//! one call decides the requests queued behind another, for every key,
//! leasing or not.
//!
//! **What a lease can strand.** A replica holds one pool per key, of at
//! most `limit / (span * 32)` passes: at most that many are left unspent
//! per bucket when demand stops at once, so at most `N * limit / 32` of a
//! window across `N` replicas (9.4 % of the limit with three replicas, a
//! pessimistic bound: demand that stops right after each lease). Under
//! steady demand the lease is sized to what arrives before its bucket
//! ends, and the replicas admit at least 95 % of the limit under overload.
//! (Passes one call took for requests queued behind another can strand
//! too, if those requests went away before its answer and no other
//! request takes them before the bucket ends.)
//!
//! A leased pass still has to fit the replica's own window, as every pass
//! from Redis does (see [a server that forgets](#a-server-that-forgets)).
//! [`set_limit`](RedisStore::set_limit) drops this store's lease of the
//! key; another replica spends its lease until the bucket ends (passes
//! already counted under the old limit).
//!
//! # Keys in Redis
//!
//! A key's buckets are named `<prefix>{<id>}:<bucket ms>x<sample count>`
//! (default prefix `tsw:`; `+1` at the end when strict), for example
//! `tsw:{fbfa88cc…60a2f1e3}:100x10` for the key `"/login"` on the default
//! window (64 hex digits in full), with `id` 64 hex
//! digits: the SHA-256 digest of the key's stable byte form
//! ([`StoreKey`]). So every replica names a key the same way, a key of any
//! length or bytes costs Redis one short name, no one can search offline
//! for two client keys that share a window (a cryptographic hash, with no
//! key to publish), and the braces make the id the Redis Cluster hash tag:
//! a key's buckets and its shared limit (the same name and `:limit`) are
//! in one slot.
//!
//! The window's shape is in the name: layers with different windows on the
//! same key (a per-second and a per-minute limit on one route, say) keep
//! separate buckets and separate shared limits on one server, under one
//! prefix, without touching each other's.
//!
//! A further window's buckets (see [several windows](#several-windows))
//! are named after the first window's, with `/<interval ms>ms` at the end:
//! `tsw:{fbfa88cc…60a2f1e3}:100x10/60000ms` for a minute on top of the
//! default window. They share the key's hash tag, so every window of a key
//! is in one Redis Cluster slot, and never take a one-window layer's name
//! (a layer whose only window is a minute keeps `…:6000x10`).
//!
//! Long keys: the built-in string extractors turn a key longer than
//! [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES) into a digest form under a
//! hash key drawn at random by each process (see
//! [long keys](crate::key#long-keys)), so such a key is named differently
//! by each replica: each replica then has its own window in Redis for it
//! (at most the limit per replica, as without a store). Keys up to that
//! length, and keys of your own [`StoreKey`] types, are shared.
//!
//! A key's data is read as this store writes it, whole counts from 0 to
//! 2^53: anything else in a key's hash (a negative or fractional count,
//! `nan`, `inf`, text) is deleted when the script meets it, never counted.
//! A key whose name holds something that is not a hash (another program's
//! string, say) is that key's error alone
//! ([`StoreErrorKind::KeyData`], counted in
//! [`StoreStatus::key_errors`]): the request is answered by the failure
//! policy, and the store stays in Redis for every other key.
//!
//! Every key the store writes expires on its own: the buckets two windows
//! after the last pass ([`PEXPIRE`] on every write), a shared limit after
//! [`limit_ttl`](RedisStore::limit_ttl) without use. A flood of distinct
//! keys costs Redis at most one small hash per key passed in the last two
//! windows.
//!
//! # Limits
//!
//! Each call passes the caller's limit for the key. A limit set with
//! [`RedisStore::set_limit`] is written to Redis and overrides the limit
//! every replica passes for that key, so one call reaches every replica
//! (from their next request). [`RedisStore::remove_limit`] deletes it.
//!
//! # Redis Cluster
//!
//! [`connect_cluster`](RedisStore::connect_cluster) (feature
//! `redis-cluster`) makes the same store on a Redis Cluster: a key's names
//! share its id as their hash tag, so each script call touches one slot and
//! runs on the primary that holds it, and keys spread over every primary.
//! The script is loaded on every primary at connect, and again on
//! `NOSCRIPT` (a primary that restarted, or took over); the client follows
//! `MOVED` and `ASK` while slots move. A primary that cannot be reached is
//! a failure as below: the whole store switches to fallback until a probe
//! succeeds.
//!
//! # Failures
//!
//! Every round trip is bounded by a [`timeout`](RedisStore::timeout)
//! (default 100 ms). The connection is re-established on its own, with
//! backoff, after an error. The first failure switches the store to
//! [`StoreMode::Fallback`] and logs one warning: requests are then answered
//! at once by the failure policy ([`StoreFailure`], chosen on the layer)
//! without waiting on Redis, and one request per
//! [`probe_interval`](RedisStore::probe_interval) tries Redis again. The
//! first success switches back and logs one notice. [`RedisStore::status`]
//! shows the mode and the counts.
//!
//! **Redis down at start.** [`connect`](RedisStore::connect) fails when the
//! server cannot be reached. [`connect_lazy`](RedisStore::connect_lazy)
//! returns at once: the store starts in fallback, connects in the
//! background, and joins the shared limit from the first probe that finds
//! the server up.
//!
//! # A server that forgets
//!
//! Redis can lose a key's passes in the middle of a window: a `FLUSHALL`,
//! a restart without persistence (the script cache is empty too: the
//! script is loaded again on `NOSCRIPT`), a promoted replica that had not
//! seen the last writes. The script then counts from what is left, and
//! grants passes it had already granted. A layer with a store does not
//! take them on trust: a pass Redis grants is admitted only if it also
//! fits the replica's own window for the key (the one it keeps for its
//! statistics), at the limit Redis applied. So, whatever Redis answers:
//!
//! - each replica admits at most the limit in its own window for a key;
//! - for the rest of the window in which the state was lost, Redis goes on
//!   deciding from its new count, which every replica still shares: across
//!   any number of replicas at most 2 x limit pass in that window (what
//!   passed before the loss, at most the limit, and what Redis counts
//!   after it, at most the limit), while the connection holds. A restart
//!   breaks it, and until it is back the failure policy answers
//!   ([`StoreFailure::Local`]: the replicas' own windows, at most
//!   `N x limit`). From the next window the count is exact again.
//!
//! A pass Redis granted and the replica's window refused stays counted in
//! Redis: the cap errs toward fewer passes. The replicas' clocks cut their
//! own windows, so when they cut buckets at other moments than the Redis
//! server's clock, a replica's window can hold part of a bucket Redis has
//! already dropped, and under overload a replica may now and then refuse a
//! pass Redis granted (at most one bucket's worth).
//!
//! The cap is the layer's: [`RedisStore::admit`] called directly has no
//! window of this process to check against and reports what Redis decided.
//!
//! # A server that evicts keys
//!
//! A server with a `maxmemory` and an evicting `maxmemory-policy`
//! (`allkeys-*`, or `volatile-*`: every key of this store has a TTL) drops
//! a key's buckets whenever other data fills its memory, and that key then
//! passes the limit again: a shared limit it cannot be. The store reads
//! the policy (with `INFO memory`, which managed services allow) when it
//! connects and whenever it tries Redis again after a failure (so after a
//! reconnect), and reports it in [`StoreStatus::evicting`]. While the
//! policy evicts, the store does not decide in Redis: requests are
//! answered by the failure policy, and each probe reads the policy again,
//! so the store is back in Redis one probe interval after the server is
//! set to `noeviction`.
//! [`allow_evicting_server`](RedisStore::allow_evicting_server) decides in
//! Redis anyway. Run Redis with `maxmemory-policy noeviction` and memory to
//! spare: then a full server refuses writes (`OOM`), which the store
//! treats as any failure (the failure policy answers), instead of dropping
//! windows without a word.
//!
//! [`PEXPIRE`]: https://redis.io/docs/latest/commands/pexpire/

mod blocked;
mod connection;
mod error;
mod identity;
mod lease;
mod status;

pub use error::{StoreError, StoreErrorKind};
pub use identity::{KeyBytes, StoreKey};
pub use status::{StoreMode, StoreStatus};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use self::blocked::{Blocked, BlockedKeys};
use self::connection::{policy_in, Connection};
use self::identity::{further_name, redis_names};
pub(crate) use self::identity::{identity, KeyId};
use self::lease::{lag_us, max_lease, slack_us, Grant, Leases, Step, LEASE_SHARE, TICK_US};
use self::status::{Health, Route};
use crate::clock::{Clock, SharedClock};
use crate::stat::validate_window;

/// What a layer with a [`RedisStore`] does while Redis cannot decide (an
/// error, no answer within the timeout, not connected yet, a server that
/// evicts keys, or, for one key, its data in Redis unusable). Chosen with
/// `SlidingWindowLayer::on_store_error`.
///
/// | policy | while Redis is down |
/// | --- | --- |
/// | `Local` (default) | this replica's own window decides, with the same limit: the total across `N` replicas is at most `N x limit` |
/// | `Allow` | every request passes (fail open) |
/// | `Deny` | every request is refused with the rejection response (fail closed) |
///
/// Whatever the policy, no request waits longer than the store's timeout,
/// and none fails with a server error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreFailure {
    /// Fall back to this replica's own window, with the same limit.
    #[default]
    Local,
    /// Admit every request.
    Allow,
    /// Refuse every request.
    Deny,
}

/// The outcome of one admission through a [`RedisStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verdict {
    /// Whether the request passed (its pass is recorded in Redis).
    pub passed: bool,
    /// Passes of the key in the current window, this one included when it
    /// passed (across every replica).
    pub window_pass: u64,
    /// The limit applied: the shared limit set with
    /// [`RedisStore::set_limit`] if there is one, else the caller's.
    pub limit: u64,
    /// When refused: the time until a request could pass, or `None` if it
    /// never can at this limit (a limit of 0, or `n` above it).
    pub retry_after: Option<Duration>,
    /// Answered without a round trip: refused because the key was known
    /// to be blocked, or passed with a leased pass.
    pub answered_locally: bool,
}

/// A further window of a layer's admission (`limit_per`): its interval and
/// the caller's limit for the key in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FurtherWindow {
    pub(crate) interval_ms: u64,
    pub(crate) limit: u64,
}

/// The window shape a store decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RemoteWindow {
    pub(crate) sample_count: usize,
    pub(crate) interval_ms: u64,
    pub(crate) strict: bool,
}

impl RemoteWindow {
    /// The shape of a layer's window.
    pub(crate) fn of(window: &crate::store::Window) -> Self {
        RemoteWindow {
            sample_count: window.sample_count,
            interval_ms: window.interval_ms,
            strict: window.strict,
        }
    }

    pub(crate) fn bucket_ms(&self) -> u64 {
        self.interval_ms / self.sample_count as u64
    }

    fn span(&self) -> u64 {
        self.sample_count as u64 + u64::from(self.strict)
    }
}

/// What every clone of a store shares: the connection, the script and the
/// health of the link (with what is known of the server's eviction policy).
struct Link {
    connection: Connection,
    script: Script,
    health: Health,
}

/// The script: decides and records one admission (see `admit.lua`).
const ADMIT_LUA: &str = include_str!("admit.lua");

/// Largest limit sent to the script: Lua numbers are doubles, exact up to
/// 2^53. A larger limit admits as 2^53 does (no real window holds more).
const MAX_SCRIPT_LIMIT: u64 = 1 << 53;

/// Time allowed to open the first connection and load the script.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
const DEFAULT_PROBE: Duration = Duration::from_millis(500);
const DEFAULT_LIMIT_TTL: Duration = Duration::from_secs(24 * 3600);
const DEFAULT_PREFIX: &str = "tsw:";
/// The default window: 10 buckets of 100 ms.
const DEFAULT_WINDOW: RemoteWindow = RemoteWindow {
    sample_count: 10,
    interval_ms: 1000,
    strict: false,
};
/// Longest prefix accepted, in bytes.
const MAX_PREFIX_BYTES: usize = 256;

/// Limits shared across replicas through one Redis server.
///
/// Connect once per process with [`connect`](Self::connect); clones share
/// the connection (cheap: an `Arc`). The builder methods return a store
/// that shares the connection and its [`status`](Self::status) with
/// different settings. See the [module docs](self) for how it decides and
/// fails.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_sliding_window::store::RedisStore;
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379/")
///     .await?
///     .prefix("api:")
///     .timeout(Duration::from_millis(20));
///
/// // 100 per second for "/search", shared by every replica.
/// let verdict = store.admit("/search", 100).await?;
/// if !verdict.passed {
///     println!("retry in {:?}", verdict.retry_after);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    link: Arc<Link>,
    prefix: Arc<str>,
    window: RemoteWindow,
    timeout: Duration,
    probe: Duration,
    limit_ttl: Duration,
    /// Decide in Redis even when its policy evicts keys.
    allow_evicting: bool,
    /// Hot keys lease passes (the default).
    lease: bool,
    /// `None`: Redis's `TIME` cuts the buckets, this store's system clock
    /// times the local refusals and probes.
    clock: Option<SharedClock>,
    local_clock: SharedClock,
    /// Keys known to be blocked under these settings; a builder method
    /// that changes what a verdict means starts a new table.
    blocked: Arc<BlockedKeys>,
    /// Hot keys' leases under these settings (a new table with `blocked`).
    leases: Arc<Leases>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("window", &self.window)
            .field("timeout", &self.timeout)
            .field("probe_interval", &self.probe)
            .field("manual_time", &self.clock.is_some())
            .field("allow_evicting_server", &self.allow_evicting)
            .field("leases", &self.lease)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// # Connecting and settings
impl RedisStore {
    /// Connects to the Redis server at `url` (`redis://[user:password@]host[:port][/db]`),
    /// loads the admission script and reads the server's eviction policy
    /// (see [a server that evicts keys](self#a-server-that-evicts-keys)).
    ///
    /// Fails if the URL is invalid, or the server cannot be reached within
    /// 5 s: a replica that must start while Redis may still be down uses
    /// [`connect_lazy`](Self::connect_lazy) instead. Once connected, the
    /// store reconnects on its own whenever the connection breaks.
    ///
    /// Needs a tokio runtime with its time driver (tokio's `rt` and `time`
    /// features; `#[tokio::main]` has both).
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        let client = client(url)?;
        let connect = async {
            let connection = ConnectionManager::new_with_config(client, manager_config())
                .await
                .map_err(|err| StoreError::redis(StoreErrorKind::Connect, err))?;
            prepare(Connection::Single(connection)).await
        };
        RedisStore::connected(connect).await
    }

    /// Connects to a Redis Cluster (or a Valkey cluster) through any of
    /// its `nodes` (URLs as [`connect`](Self::connect) takes; one reachable
    /// node is enough, the client learns the others from it), loads the
    /// admission script on every primary and reads their eviction policies
    /// (one evicting primary is enough for the store to refuse the
    /// cluster, see [a server that evicts keys](self#a-server-that-evicts-keys)).
    /// Feature `redis-cluster`.
    ///
    /// The store then decides as on one server: every name of a key (its
    /// buckets and its shared limit) carries the key's id as its hash tag,
    /// so each script call touches one slot, and goes to the primary that
    /// holds it. The client follows `MOVED` and `ASK` redirections while
    /// slots move, and a primary that answers `NOSCRIPT` (a new one after a
    /// failover, say) gets the script again before the call is repeated.
    /// A primary that cannot be reached is a failure like any other: the
    /// store switches to fallback, the failure policy answers, and the
    /// probes bring it back once the cluster serves every slot again.
    ///
    /// Fails if `nodes` is empty or holds an invalid URL, or if the
    /// cluster cannot be reached within 5 s.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_sliding_window::store::RedisStore;
    ///
    /// let store = RedisStore::connect_cluster([
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])
    /// .await?;
    /// let verdict = store.admit("/search", 100).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis-cluster")]
    pub async fn connect_cluster<I, U>(nodes: I) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        let nodes: Vec<String> = nodes
            .into_iter()
            .map(|url| url.as_ref().to_owned())
            .collect();
        if nodes.is_empty() {
            return Err(StoreError::new(
                StoreErrorKind::InvalidUrl,
                "RedisStore::connect_cluster: nodes must hold at least one URL",
            ));
        }
        let client = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(CONNECT_TIMEOUT)
            // Each round trip is bounded by the store's own timeout.
            .response_timeout(CONNECT_TIMEOUT)
            // A few quick retries (a redirection, a node coming back);
            // the store's timeout ends a call that takes longer.
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(200)
            .build()
            .map_err(|err| StoreError::redis(StoreErrorKind::InvalidUrl, err))?;
        let connect = async {
            let connection = client
                .get_async_connection()
                .await
                .map_err(|err| StoreError::redis(StoreErrorKind::Connect, err))?;
            prepare(Connection::Cluster(connection)).await
        };
        RedisStore::connected(connect).await
    }

    /// The store on a connection `connect` makes and prepares, within the
    /// connect timeout.
    async fn connected(
        connect: impl std::future::Future<Output = Result<(Connection, String), StoreError>>,
    ) -> Result<RedisStore, StoreError> {
        let (connection, policy) = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| StoreError::new(StoreErrorKind::Connect, "no connection within 5 s"))??;
        let health = Health::default();
        health.set_policy(&policy);
        Ok(RedisStore::with_link(Link {
            connection,
            script: Script::new(ADMIT_LUA),
            health,
        }))
    }

    /// A store for a server that may not be up yet: returns at once, and
    /// connects in the background.
    ///
    /// The store starts in [`StoreMode::Fallback`] and switches to Redis
    /// as soon as the connection is made. Until then requests are answered
    /// by the failure policy (the layer's `on_store_error`), and one per
    /// [`probe_interval`](Self::probe_interval) tries Redis, so a replica
    /// started before its Redis serves from the start and joins the shared
    /// limit once the server is up (within a probe interval or two, with
    /// the reconnection's backoff). The eviction policy is read when the
    /// connection is first made, and by the probes. From then on it
    /// behaves as a store from [`connect`](Self::connect).
    ///
    /// Fails only if the URL is invalid, or when called outside a tokio
    /// runtime (the connection is made on it).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_sliding_window::store::{RedisStore, StoreFailure};
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// // Redis may come up after this replica: until it does, each
    /// // replica's own window decides (`StoreFailure::Local`).
    /// let store = RedisStore::connect_lazy("redis://redis.internal:6379/")?;
    /// let layer = SlidingWindowLayer::qps(100)
    ///     .store(store)
    ///     .on_store_error(StoreFailure::Local);
    /// # Ok(())
    /// # }
    /// ```
    pub fn connect_lazy(url: &str) -> Result<RedisStore, StoreError> {
        let client = client(url)?;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(StoreError::new(
                StoreErrorKind::Connect,
                "RedisStore::connect_lazy needs a tokio runtime (call it inside one)",
            ));
        };
        let connection = Connection::Single(
            ConnectionManager::new_lazy_with_config(client, manager_config())
                .map_err(|err| StoreError::redis(StoreErrorKind::Connect, err))?,
        );
        let store = RedisStore::with_link(Link {
            connection,
            script: Script::new(ADMIT_LUA),
            health: Health::not_connected(),
        });
        // Makes the first connection, reads the policy on it, and
        // switches the store to Redis. The script is loaded by its first
        // call (`NOSCRIPT`, then `EVALSHA` again). If Redis is not up, the
        // probes find it later.
        let link = Arc::clone(&store.link);
        runtime.spawn(async move {
            let mut connection = link.connection.clone();
            match tokio::time::timeout(CONNECT_TIMEOUT, read_policy(&mut connection)).await {
                Ok(Ok(policy)) => {
                    link.health.set_policy(&policy);
                    link.health.succeeded();
                }
                Ok(Err(err)) => tracing::warn!(
                    error = %err,
                    "redis store: redis cannot be reached yet; the failure policy answers \
                     until it can"
                ),
                Err(_) => tracing::warn!(
                    "redis store: no connection to redis within 5 s; the failure policy \
                     answers until there is one"
                ),
            }
        });
        Ok(store)
    }

    fn with_link(link: Link) -> RedisStore {
        RedisStore {
            link: Arc::new(link),
            prefix: Arc::from(DEFAULT_PREFIX),
            window: DEFAULT_WINDOW,
            timeout: DEFAULT_TIMEOUT,
            probe: DEFAULT_PROBE,
            limit_ttl: DEFAULT_LIMIT_TTL,
            allow_evicting: false,
            lease: true,
            clock: None,
            local_clock: SharedClock::system(),
            blocked: Arc::new(BlockedKeys::default()),
            leases: Arc::new(Leases::default()),
        }
    }

    fn fresh_blocked(mut self) -> Self {
        self.blocked = Arc::new(BlockedKeys::default());
        self.leases = Arc::new(Leases::default());
        self
    }

    /// Puts every Redis key of this store under `prefix` (default `"tsw:"`).
    /// Stores with different prefixes keep separate windows on one server.
    ///
    /// # Panics
    ///
    /// When `prefix` contains `{` or `}` (the key's hash tag must be the
    /// only one), or is longer than 256 bytes.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        assert!(
            !prefix.contains(['{', '}']),
            "RedisStore::prefix: invalid `prefix`: must not contain `{{` or `}}` (got {prefix:?})"
        );
        assert!(
            prefix.len() <= MAX_PREFIX_BYTES,
            "RedisStore::prefix: invalid `prefix`: must be at most {MAX_PREFIX_BYTES} bytes \
             (got {} bytes)",
            prefix.len()
        );
        self.prefix = Arc::from(prefix);
        self.fresh_blocked()
    }

    /// Sets the window: `sample_count` buckets over `interval` (default 1 s
    /// and 10), as [`SlidingWindowLayer::window`](crate::SlidingWindowLayer::window).
    /// Replicas that share a key must use the same window. A layer's
    /// [`store`](crate::SlidingWindowLayer::store) sets this from its own
    /// window.
    ///
    /// # Panics
    ///
    /// As [`SlidingWindowLayer::window`](crate::SlidingWindowLayer::window):
    /// when `interval` is not a whole, non-zero number of milliseconds that
    /// `sample_count` divides, or `sample_count` is 0 or too large.
    pub fn window(self, interval: Duration, sample_count: usize) -> Self {
        assert!(
            interval.subsec_nanos() % 1_000_000 == 0,
            "RedisStore::window: invalid `interval`: must be a whole number of milliseconds \
             (got {interval:?})"
        );
        let Ok(interval_ms) = u64::try_from(interval.as_millis()) else {
            panic!("RedisStore::window: invalid `interval`: too long (got {interval:?})");
        };
        if let Err(err) = validate_window(sample_count, interval_ms) {
            panic!("RedisStore::window: {err}");
        }
        let strict = self.window.strict;
        self.with_window(RemoteWindow {
            sample_count,
            interval_ms,
            strict,
        })
    }

    /// Counts the bucket that has just left the window too, as
    /// [`SlidingWindowLayer::strict`](crate::SlidingWindowLayer::strict):
    /// then no interval of the window's length, starting anywhere (on the
    /// Redis server's clock), holds more than the limit.
    pub fn strict(self) -> Self {
        let window = RemoteWindow {
            strict: true,
            ..self.window
        };
        self.with_window(window)
    }

    pub(crate) fn with_window(mut self, window: RemoteWindow) -> Self {
        if self.window == window {
            return self;
        }
        self.window = window;
        self.fresh_blocked()
    }

    /// Bounds every round trip to Redis (default 100 ms). A request never
    /// waits on Redis longer than this; past it, the failure policy
    /// answers.
    ///
    /// # Panics
    ///
    /// When `timeout` is zero.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        assert!(
            !timeout.is_zero(),
            "RedisStore::timeout: invalid `timeout`: must be greater than 0 (got {timeout:?})"
        );
        self.timeout = timeout;
        self
    }

    /// While Redis is failing, how often one request tries it again
    /// (default 500 ms); the others are answered by the failure policy at
    /// once.
    ///
    /// # Panics
    ///
    /// When `interval` is zero.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        assert!(
            !interval.is_zero(),
            "RedisStore::probe_interval: invalid `probe_interval`: must be greater than 0 \
             (got {interval:?})"
        );
        self.probe = interval;
        self
    }

    /// How long a limit written by [`set_limit`](Self::set_limit) lives in
    /// Redis without being used (default 24 h); each admission of the key
    /// renews it.
    ///
    /// # Panics
    ///
    /// When `ttl` is shorter than 1 ms.
    pub fn limit_ttl(mut self, ttl: Duration) -> Self {
        assert!(
            ttl >= Duration::from_millis(1),
            "RedisStore::limit_ttl: invalid `limit_ttl`: must be at least 1 ms (got {ttl:?})"
        );
        self.limit_ttl = ttl;
        self
    }

    /// Cuts buckets with `clock` instead of the Redis server's `TIME`: its
    /// time is sent with every call. For deterministic tests with a
    /// [`ManualClock`](crate::clock::ManualClock); every store sharing keys
    /// must then share the clock, or they disagree on window edges. The
    /// clock also times the local refusals of blocked keys and the probes
    /// while in fallback. Leave it unset in production.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        let clock = SharedClock::new(clock);
        self.local_clock = clock.clone();
        self.clock = Some(clock);
        self.fresh_blocked()
    }

    /// Decides in Redis even when the server's `maxmemory-policy` evicts
    /// keys (anything but `noeviction`). By default such a server is not
    /// trusted with the limits: it drops a key's buckets when its memory
    /// fills, and that key passes the limit again, so requests are answered
    /// by the failure policy until the server is set to `noeviction` (see
    /// [a server that evicts keys](self#a-server-that-evicts-keys)). With
    /// this setting, [`StoreStatus::evicting`] still reports it.
    pub fn allow_evicting_server(mut self) -> Self {
        self.allow_evicting = true;
        self
    }

    /// Turns [leases](self#leases-for-hot-keys) off (`false`) or on
    /// (`true`, the default). Off, no key takes passes ahead of its
    /// requests, as for a key that is not hot: each call asks for the
    /// requests waiting for it only (the one that makes it, and those
    /// queued behind a call in flight). For comparisons, or where no pass
    /// may be reserved ahead of its request. A key of a layer with further
    /// windows (`limit_per`) never leases, nor shares a call with queued
    /// requests, whatever this says: one call per request (see
    /// [several windows](self#several-windows)).
    pub fn leases(mut self, on: bool) -> Self {
        self.lease = on;
        self
    }

    /// Whether this store refuses to decide on the server, as its policy
    /// was last read.
    fn refuses_server(&self) -> bool {
        !self.allow_evicting && self.link.health.evicting()
    }

    /// While in fallback, how long until Redis is tried again (the retry
    /// time a `Deny` policy gives), in ms.
    pub(crate) fn probe_ms(&self) -> u64 {
        millis(self.probe)
    }

    /// The store's mode and counters, shared by every clone (the mode is
    /// [`StoreMode::Fallback`] too while this store refuses a server that
    /// evicts keys).
    pub fn status(&self) -> StoreStatus {
        let mut status = self.link.health.status();
        if self.refuses_server() {
            status.mode = StoreMode::Fallback;
        }
        status
    }
}

/// # Admissions and limits
impl RedisStore {
    /// Asks for one pass of `key` at `limit` per window; see
    /// [`admit_n`](Self::admit_n).
    pub async fn admit<K: StoreKey + ?Sized>(
        &self,
        key: &K,
        limit: u64,
    ) -> Result<Verdict, StoreError> {
        self.admit_n(key, limit, 1).await
    }

    /// Asks for `n` passes of `key` at `limit` per window (or the limit set
    /// in Redis with [`set_limit`](Self::set_limit)): they pass, and are
    /// recorded, if the window's passes plus `n` stay within the limit.
    ///
    /// A key known to be blocked is refused without a round trip. Fails,
    /// without waiting longer than the timeout, when Redis does not answer
    /// in time or answers an error; fails at once with
    /// [`StoreErrorKind::Unavailable`] while the store is in fallback
    /// between probes. The caller then applies its failure policy.
    pub async fn admit_n<K: StoreKey + ?Sized>(
        &self,
        key: &K,
        limit: u64,
        n: u64,
    ) -> Result<Verdict, StoreError> {
        self.admit_id(identity(key), limit, n).await
    }

    /// The refusal in force for the key `id`, if it is known to be blocked
    /// for `n` passes: no round trip, no waiting.
    pub(crate) fn known_blocked(&self, id: KeyId, n: u64) -> Option<Verdict> {
        let now = self.local_clock.now_millis();
        let blocked = self.blocked.check(id, n, now)?;
        self.link.health.answered_locally();
        Some(Verdict {
            passed: false,
            window_pass: blocked.window_pass,
            limit: blocked.limit,
            retry_after: Some(Duration::from_millis(blocked.until_ms - now)),
            answered_locally: true,
        })
    }

    /// Whether a request for `n` passes at `limit` may lease: one pass, at
    /// a limit large enough for a lease of two.
    fn leases_at(&self, limit: u64, n: u64) -> bool {
        self.lease && n == 1 && max_lease(limit.min(MAX_SCRIPT_LIMIT), self.window.span()) >= 2
    }

    /// The lease clock, µs: the manual clock's time when there is one (the
    /// time sent to the script), else a monotonic clock.
    fn lease_now_us(&self) -> u64 {
        match &self.clock {
            Some(clock) => clock.now_millis().saturating_mul(1000),
            None => self.leases.elapsed_us(),
        }
    }

    /// A request for one pass of `id` at `limit`, answered from the key's
    /// lease if it holds a pass of the current bucket: no round trip. The
    /// request is counted towards the key's rate whether or not it is
    /// answered here. Starts a refill of the lease in the background when
    /// it runs low (on the current tokio runtime, if there is one).
    pub(crate) fn spend_lease(&self, id: KeyId, limit: u64) -> Option<Verdict> {
        if !self.leases_at(limit, 1) {
            return None;
        }
        let now_us = self.lease_now_us();
        let max = max_lease(limit.min(MAX_SCRIPT_LIMIT), self.window.span());
        let rtt_us = self.leases.rtt_us();
        let mut stranded = 0;
        let step = {
            let mut table = self.leases.lock();
            let lease = table.get(id, now_us, &mut stranded)?;
            lease.arrive(now_us);
            stranded += lease.expire(now_us);
            lease
                .take(now_us)
                .map(|spent| (spent, lease.refill(rtt_us, max), lease.rate()))
        };
        self.link.health.stranded(stranded);
        let (spent, refill, rate) = step?;
        self.link.health.lease_spent();
        if let Some(want) = refill {
            self.start_refill(id, limit, want, rate);
        }
        Some(Verdict {
            passed: true,
            window_pass: spent.window_pass,
            limit: spent.limit,
            retry_after: None,
            answered_locally: true,
        })
    }

    /// Asks for `want` passes for `id`'s pool in the background.
    fn start_refill(&self, id: KeyId, limit: u64, want: u64, rate: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if let Some(lease) = self.leases.lock().existing(id) {
                lease.failed(want);
            }
            return;
        };
        let store = self.clone();
        runtime.spawn(async move {
            let sent_us = store.lease_now_us();
            let ask = LeaseAsk {
                want,
                rate,
                batch: 0,
            };
            // Reported as failed if the task is dropped first (its runtime
            // shutting down).
            let asked = Registered::asked(&store, id, want);
            let result = store
                .decide_in_redis(id, limit, 1, Some(ask), false, &[])
                .await;
            asked.disarm();
            store.lease_answer(
                id,
                want,
                0,
                sent_us,
                result.ok().and_then(|(_, grant)| grant),
            );
        });
    }

    /// Reports a call's answer to `id`'s lease: `asked` passes were asked
    /// for the pool, `kept` of the granted went to the caller.
    fn lease_answer(&self, id: KeyId, asked: u64, kept: u64, sent_us: u64, grant: Option<Grant>) {
        let now_us = self.lease_now_us();
        let stranded = {
            let mut table = self.leases.lock();
            match (table.existing(id), grant) {
                (Some(lease), Some(grant)) => {
                    let slack = if self.clock.is_some() {
                        0
                    } else {
                        slack_us(grant.ends_us)
                    };
                    lease.granted(asked, kept, grant, (sent_us, now_us, slack))
                }
                (Some(lease), None) => {
                    lease.failed(asked);
                    0
                }
                // No state for the key (the table was full): nothing to
                // pool the passes in.
                (None, Some(grant)) => grant.granted.saturating_sub(kept),
                (None, None) => 0,
            }
        };
        if let Some(grant) = grant {
            self.link.health.leased(grant.granted.saturating_sub(kept));
        }
        self.link.health.stranded(stranded);
        self.leases.wake(id).notify_waiters();
    }

    /// [`admit_n`](Self::admit_n) for a key already turned into its
    /// identity.
    pub(crate) async fn admit_id(
        &self,
        id: KeyId,
        limit: u64,
        n: u64,
    ) -> Result<Verdict, StoreError> {
        if self.leases_at(limit, n) {
            if let Some(verdict) = self.spend_lease(id, limit) {
                return Ok(verdict);
            }
        }
        self.admit_after_lease(id, limit, n).await
    }

    /// [`admit_id`](Self::admit_id) for a request that found no leased
    /// pass with [`spend_lease`](Self::spend_lease) (and was counted
    /// there): waits for a call in flight that may bring one, else asks
    /// Redis, for a lease when the key is hot.
    pub(crate) async fn admit_after_lease(
        &self,
        id: KeyId,
        limit: u64,
        n: u64,
    ) -> Result<Verdict, StoreError> {
        if n != 1 {
            if let Some(verdict) = self.known_blocked(id, n) {
                return Ok(verdict);
            }
            return self
                .decide_in_redis(id, limit, n, None, true, &[])
                .await
                .map(|(verdict, _)| verdict);
        }
        let max = if self.lease {
            max_lease(limit.min(MAX_SCRIPT_LIMIT), self.window.span())
        } else {
            1
        };
        let wake = self.leases.wake(id);
        // Waits for calls in flight end with the store's timeout; then the
        // request asks on its own.
        let wait_until = tokio::time::Instant::now() + self.timeout;
        loop {
            let now_us = self.lease_now_us();
            let rtt_us = self.leases.rtt_us();
            let may_wait = tokio::time::Instant::now() < wait_until;
            let woken = wake.notified();
            let mut woken = std::pin::pin!(woken);
            let mut stranded = 0;
            let step = {
                let mut table = self.leases.lock();
                table.get(id, now_us, &mut stranded).map(|lease| {
                    stranded += lease.expire(now_us);
                    let step = lease.step(now_us, rtt_us, max, may_wait);
                    if step == Step::Wait {
                        // Registered before the lock is released: the reply
                        // that ends the wait wakes it after updating the
                        // table under the lock.
                        woken.as_mut().enable();
                    }
                    (step, lease.rate())
                })
            };
            self.link.health.stranded(stranded);
            let Some((step, rate)) = step else {
                // No room for the key's state: one pass at a time.
                if let Some(verdict) = self.known_blocked(id, n) {
                    return Ok(verdict);
                }
                return self
                    .decide_in_redis(id, limit, n, None, true, &[])
                    .await
                    .map(|(verdict, _)| verdict);
            };
            match step {
                Step::Spend(spent, refill) => {
                    self.link.health.lease_spent();
                    if let Some(want) = refill {
                        self.start_refill(id, limit, want, rate);
                    }
                    return Ok(Verdict {
                        passed: true,
                        window_pass: spent.window_pass,
                        limit: spent.limit,
                        retry_after: None,
                        answered_locally: true,
                    });
                }
                Step::Wait => {
                    // Leaves the waiters when done, or when this request
                    // is dropped while it waits.
                    let _waiting = Registered::waiting(self, id);
                    let _ = tokio::time::timeout_at(wait_until, woken).await;
                }
                Step::Ask(ask) => {
                    if let Some(verdict) = self.known_blocked(id, n) {
                        if let Some(lease) = self.leases.lock().existing(id) {
                            lease.failed(ask.want - 1);
                        }
                        self.leases.wake(id).notify_waiters();
                        return Ok(verdict);
                    }
                    let sent_us = now_us;
                    let lease = (ask.want > 1).then_some(LeaseAsk {
                        want: ask.want,
                        rate,
                        batch: ask.batch,
                    });
                    // Reports the call as failed if this request is dropped
                    // before its answer (the passes Redis may grant it stay
                    // counted there, and are never spent).
                    let asked = Registered::asked(self, id, ask.want - 1);
                    let result = self.decide_in_redis(id, limit, n, lease, true, &[]).await;
                    asked.disarm();
                    let grant = result.as_ref().ok().and_then(|(_, grant)| *grant);
                    self.lease_answer(id, ask.want - 1, 1, sent_us, grant);
                    return result.map(|(verdict, _)| verdict);
                }
            }
        }
    }

    /// One admission of `id` on every window of a layer with further
    /// windows (`limit_per`): one pass at `limit` in the first window and
    /// at each [`FurtherWindow`]'s limit in it, decided and recorded in one
    /// script call, in every window or in none. Never leased: each call
    /// decides one request (see [leases](self#leases-for-hot-keys)). The
    /// verdict's `limit` and `window_pass` are the first window's; a
    /// refusal's `retry_after` is the longest wait among the windows. The
    /// caller checks [`known_blocked`](Self::known_blocked) first.
    pub(crate) async fn admit_windows(
        &self,
        id: KeyId,
        limit: u64,
        further: &[FurtherWindow],
    ) -> Result<Verdict, StoreError> {
        self.decide_in_redis(id, limit, 1, None, true, further)
            .await
            .map(|(verdict, _)| verdict)
    }

    /// One script call: decides `n` passes of `id` at `limit` (and, with
    /// `lease`, asks for more for the key's pool; with `further` windows,
    /// decides on them too, all or none, never with a lease), and records
    /// what the answer says of the link. A refusal is remembered when
    /// `remember`. Returns the verdict for the caller's `n` passes and, for
    /// a lease, what was granted in all.
    async fn decide_in_redis(
        &self,
        id: KeyId,
        limit: u64,
        n: u64,
        lease: Option<LeaseAsk>,
        remember: bool,
        further: &[FurtherWindow],
    ) -> Result<(Verdict, Option<Grant>), StoreError> {
        let now = self.local_clock.now_millis();
        let probe_ms = millis(self.probe);
        let policy = match self.link.health.route(now, probe_ms, self.refuses_server()) {
            Route::Fallback => return Err(StoreError::new(StoreErrorKind::Unavailable, "")),
            Route::Remote => PolicyCheck::None,
            // After a failure (a reconnect, perhaps), or while the server
            // evicts: read its policy again, in the same script call.
            Route::Probe if self.allow_evicting => PolicyCheck::Report,
            Route::Probe => PolicyCheck::Refuse,
        };

        self.link.health.round_trip();
        let started = std::time::Instant::now();
        let reply = self.call_script(id, limit, n, lease, policy, further).await;
        let reply = match reply.and_then(parse_reply).and_then(|reply| {
            // A decision names every further window, or none was asked.
            if reply.outcome == Outcome::Decided && reply.further.len() != further.len() {
                return Err(StoreError::new(
                    StoreErrorKind::Reply,
                    format!(
                        "admission script answered for {} further windows, {} were asked",
                        reply.further.len(),
                        further.len()
                    ),
                ));
            }
            Ok(reply)
        }) {
            Ok(reply) => reply,
            Err(err) => {
                // The next probe is due a probe interval after this failure
                // was known (a timeout ends well after `now`).
                let failed_at = self.local_clock.now_millis();
                self.link.health.failed(failed_at, probe_ms, &err);
                return Err(err);
            }
        };
        self.leases
            .sample_rtt(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
        if let Some(policy) = &reply.policy {
            self.link.health.set_policy(policy);
        }
        match reply.outcome {
            // Redis answered: the link works, whatever the answer says.
            Outcome::Decided | Outcome::WrongType => self.link.health.succeeded(),
            // It works, but is not used: a store in fallback stays there
            // (no recovery is logged), the others are in fallback by their
            // refusal of the server.
            Outcome::Evicting => {}
        }
        match reply.outcome {
            Outcome::Decided => {}
            Outcome::Evicting => {
                self.link.health.answered_by_policy();
                return Err(StoreError::new(
                    StoreErrorKind::Evicting,
                    format!(
                        "maxmemory-policy {}: set it to noeviction, or allow it with \
                         RedisStore::allow_evicting_server",
                        reply.policy.as_deref().unwrap_or("?")
                    ),
                ));
            }
            Outcome::WrongType => {
                self.link.health.key_error();
                return Err(StoreError::new(
                    StoreErrorKind::KeyData,
                    "the key's name in redis holds a value that is not a hash (WRONGTYPE); \
                     delete it to use the key again",
                ));
            }
        }

        let grant = reply.lease.map(|granted| Grant {
            granted: granted.passes,
            bucket_start: granted.bucket_start,
            ends_us: granted.ends_us,
            window_pass: reply.window_pass,
            limit: reply.limit,
        });
        // The caller's passes come first among those granted: its window
        // count leaves out the ones kept for later requests.
        let kept_back = grant.map_or(0, |grant| grant.granted.saturating_sub(n));
        let verdict = Verdict {
            passed: reply.passed,
            window_pass: reply.window_pass.saturating_sub(kept_back),
            limit: reply.limit,
            retry_after: reply.wait_ms.map(Duration::from_millis),
            answered_locally: false,
        };
        if reply.passed && remember {
            self.link.health.admitted();
        }
        if let (false, Some(wait_ms), true) = (reply.passed, reply.wait_ms, remember) {
            self.blocked.remember(
                id,
                Blocked {
                    until_ms: now.saturating_add(wait_ms),
                    n,
                    window_pass: reply.window_pass,
                    limit: reply.limit,
                },
                now,
            );
        }
        Ok((verdict, grant))
    }

    async fn call_script(
        &self,
        id: KeyId,
        limit: u64,
        n: u64,
        lease: Option<LeaseAsk>,
        policy: PolicyCheck,
        further: &[FurtherWindow],
    ) -> Result<Vec<redis::Value>, StoreError> {
        let (window_key, limit_key) = redis_names(&self.prefix, id, &self.window);
        let bucket_ms = self.window.bucket_ms();
        let time = match &self.clock {
            Some(clock) => clock.now_millis().to_string(),
            None => String::new(),
        };
        let window_ttl_ms = bucket_ms
            .saturating_mul(self.window.span())
            .saturating_mul(2);
        let mut connection = self.link.connection.clone();
        let mut invocation = self.link.script.key(window_key);
        invocation
            .key(limit_key)
            .arg(limit.min(MAX_SCRIPT_LIMIT))
            .arg(n.min(MAX_SCRIPT_LIMIT))
            .arg(bucket_ms)
            .arg(self.window.sample_count)
            .arg(u8::from(self.window.strict))
            .arg(time)
            .arg(window_ttl_ms)
            .arg(millis(self.limit_ttl))
            .arg(policy as u8);
        if let Some(lease) = lease {
            // What the lease can be spent in is cut by the round trip, and
            // by the deadline's slack when the server's clock cuts buckets
            // (1/1000 of a bucket at most, and 200 µs).
            let slack = if self.clock.is_some() {
                0
            } else {
                slack_us(bucket_ms.saturating_mul(1000))
            };
            invocation
                .arg(lease.want.min(MAX_SCRIPT_LIMIT))
                .arg(lease.rate.min(MAX_SCRIPT_LIMIT))
                .arg(lag_us(self.leases.rtt_us(), slack))
                .arg(LEASE_SHARE)
                .arg(TICK_US)
                .arg(lease.batch.min(MAX_SCRIPT_LIMIT));
        } else if !further.is_empty() {
            // The lease arguments, asking for no lease (`n` passes wanted),
            // so that the further windows' come after them.
            invocation
                .arg(n.min(MAX_SCRIPT_LIMIT))
                .arg(0)
                .arg(0)
                .arg(LEASE_SHARE)
                .arg(TICK_US)
                .arg(0);
        }
        debug_assert!(lease.is_none() || further.is_empty());
        for window in further {
            // Same sample count and strictness as the first window: the
            // builder checked that the sample count divides the interval.
            let bucket_ms = window.interval_ms / self.window.sample_count as u64;
            let ttl_ms = bucket_ms
                .saturating_mul(self.window.span())
                .saturating_mul(2);
            invocation
                .key(further_name(
                    &self.prefix,
                    id,
                    &self.window,
                    window.interval_ms,
                ))
                .arg(window.limit.min(MAX_SCRIPT_LIMIT))
                .arg(bucket_ms)
                .arg(ttl_ms);
        }
        match tokio::time::timeout(self.timeout, invocation.invoke_async(&mut connection)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) => {
                let kind = if err.kind() == redis::ErrorKind::UnexpectedReturnType {
                    StoreErrorKind::Reply
                } else {
                    StoreErrorKind::Redis
                };
                Err(StoreError::redis(kind, err))
            }
            Err(_) => Err(self.timed_out()),
        }
    }

    fn timed_out(&self) -> StoreError {
        StoreError::new(
            StoreErrorKind::Timeout,
            format!("no answer within {:?}", self.timeout),
        )
    }

    /// Sets `key`'s limit in Redis: every replica that shares the store's
    /// prefix admits the key against it from its next request, whatever
    /// limit it passes itself. Expires after
    /// [`limit_ttl`](Self::limit_ttl) without use.
    ///
    /// This store forgets at once that the key was blocked; other replicas
    /// may refuse it locally until their remembered wait is over (at most
    /// one window).
    pub async fn set_limit<K: StoreKey + ?Sized>(
        &self,
        key: &K,
        limit: u64,
    ) -> Result<(), StoreError> {
        self.set_limit_id(identity(key), limit).await
    }

    pub(crate) async fn set_limit_id(&self, id: KeyId, limit: u64) -> Result<(), StoreError> {
        let (_, limit_key) = redis_names(&self.prefix, id, &self.window);
        let mut command = redis::cmd("SET");
        command
            .arg(limit_key)
            .arg(limit.min(MAX_SCRIPT_LIMIT))
            .arg("PX")
            .arg(millis(self.limit_ttl));
        self.command(command).await?;
        self.forget(id);
        Ok(())
    }

    /// Removes `key`'s limit from Redis: every replica goes back to the
    /// limit it passes. Returns whether there was one.
    pub async fn remove_limit<K: StoreKey + ?Sized>(&self, key: &K) -> Result<bool, StoreError> {
        self.remove_limit_id(identity(key)).await
    }

    pub(crate) async fn remove_limit_id(&self, id: KeyId) -> Result<bool, StoreError> {
        let (_, limit_key) = redis_names(&self.prefix, id, &self.window);
        let mut command = redis::cmd("DEL");
        command.arg(limit_key);
        let removed = self.command(command).await?;
        self.forget(id);
        Ok(matches!(removed, redis::Value::Int(n) if n > 0))
    }

    /// Forgets what this store knows of `id` under its old limit: that it
    /// was blocked, and its lease (whose passes stay counted in Redis, and
    /// are counted as stranded).
    fn forget(&self, id: KeyId) {
        self.blocked.forget(id);
        let stranded = self.leases.lock().forget(id);
        self.link.health.stranded(stranded);
    }

    async fn command(&self, command: redis::Cmd) -> Result<redis::Value, StoreError> {
        let mut connection = self.link.connection.clone();
        match tokio::time::timeout(self.timeout, command.query_async(&mut connection)).await {
            Ok(result) => result.map_err(|err| StoreError::redis(StoreErrorKind::Redis, err)),
            Err(_) => Err(self.timed_out()),
        }
    }
}

/// What a request has registered in its key's lease state, undone when it
/// is dropped: a wait (always left on drop), or a call in flight (reported
/// as failed unless disarmed once its answer is in).
struct Registered<'a> {
    store: &'a RedisStore,
    id: KeyId,
    /// `Some(asked)`: a call for `asked` passes beyond the caller's own;
    /// `None`: a wait.
    asked: Option<u64>,
    armed: bool,
}

impl<'a> Registered<'a> {
    fn waiting(store: &'a RedisStore, id: KeyId) -> Self {
        Registered {
            store,
            id,
            asked: None,
            armed: true,
        }
    }

    fn asked(store: &'a RedisStore, id: KeyId, asked: u64) -> Self {
        Registered {
            store,
            id,
            asked: Some(asked),
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(lease) = self.store.leases.lock().existing(self.id) {
            match self.asked {
                Some(asked) => lease.failed(asked),
                None => lease.woken(),
            }
        }
        if self.asked.is_some() {
            self.store.leases.wake(self.id).notify_waiters();
        }
    }
}

/// A call that asks for several passes: `want` in all, for a key that saw
/// `rate` requests in the last rate tick; `batch` of them for requests
/// already waiting (not cut to the rate).
#[derive(Debug, Clone, Copy)]
struct LeaseAsk {
    want: u64,
    rate: u64,
    batch: u64,
}

/// What a lease call was granted, from the script's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Leased {
    passes: u64,
    bucket_start: u64,
    ends_us: u64,
}

/// Whether a script call reads the server's eviction policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PolicyCheck {
    /// No: the common case.
    None = 0,
    /// Yes, and decide whatever it is.
    Report = 1,
    /// Yes, and decide nothing if the server evicts keys.
    Refuse = 2,
}

/// What became of a script call that Redis answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Passed or refused.
    Decided,
    /// The key's name holds a value that is not a hash.
    WrongType,
    /// The server evicts keys, and the call asked not to decide then.
    Evicting,
}

/// The script's answer.
#[derive(Debug)]
struct Reply {
    outcome: Outcome,
    passed: bool,
    window_pass: u64,
    /// `None`: no pass can ever fit.
    wait_ms: Option<u64>,
    limit: u64,
    /// The server's `maxmemory-policy`, when the call asked for it and the
    /// server told.
    policy: Option<String>,
    /// A lease call that passed: what it was granted.
    lease: Option<Leased>,
    /// A call with further windows: their passes, in order.
    further: Vec<u64>,
}

fn parse_reply(reply: Vec<redis::Value>) -> Result<Reply, StoreError> {
    let bad = || {
        StoreError::new(
            StoreErrorKind::Reply,
            format!("admission script answered {reply:?}"),
        )
    };
    // A call with further windows has their passes as a sixth element.
    let (reply_head, further) = match &reply[..] {
        [head @ .., redis::Value::Array(passes)] if head.len() == 5 => {
            let mut further = Vec::with_capacity(passes.len());
            for value in passes {
                match value {
                    redis::Value::Int(pass) => {
                        further.push(u64::try_from(*pass).map_err(|_| bad())?)
                    }
                    _ => return Err(bad()),
                }
            }
            (head, further)
        }
        head => (head, Vec::new()),
    };
    // A lease call that passed has three more numbers.
    let (head, lease) = match reply_head {
        [head @ .., redis::Value::Int(passes), redis::Value::Int(start), redis::Value::Int(ends_us)]
            if head.len() == 5 =>
        {
            let (Ok(passes), Ok(bucket_start), Ok(ends_us)) = (
                u64::try_from(*passes),
                u64::try_from(*start),
                u64::try_from(*ends_us),
            ) else {
                return Err(bad());
            };
            if passes == 0 {
                return Err(bad());
            }
            (
                head,
                Some(Leased {
                    passes,
                    bucket_start,
                    ends_us,
                }),
            )
        }
        head => (head, None),
    };
    let [redis::Value::Int(outcome), redis::Value::Int(window_pass), redis::Value::Int(wait), redis::Value::Int(limit), policy] =
        head
    else {
        return Err(bad());
    };
    let policy = match policy {
        redis::Value::BulkString(bytes) if bytes.is_empty() => None,
        redis::Value::BulkString(bytes) => match std::str::from_utf8(bytes) {
            Ok(policy) => Some(policy.to_owned()),
            Err(_) => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    let (Ok(window_pass), Ok(limit)) = (u64::try_from(*window_pass), u64::try_from(*limit)) else {
        return Err(bad());
    };
    let (outcome, passed) = match outcome {
        0 => (Outcome::Decided, false),
        1 => (Outcome::Decided, true),
        2 => (Outcome::WrongType, false),
        3 if policy.is_some() => (Outcome::Evicting, false),
        _ => return Err(bad()),
    };
    if lease.is_some() && !passed {
        return Err(bad());
    }
    let wait_ms = match *wait {
        -1 => None,
        0 if passed => Some(0),
        ms if ms > 0 && !passed && outcome == Outcome::Decided => Some(ms as u64),
        _ => return Err(bad()),
    };
    Ok(Reply {
        outcome,
        passed,
        window_pass,
        wait_ms: if passed { None } else { wait_ms },
        limit,
        policy,
        lease,
        further,
    })
}

/// Loads the admission script (on every primary of a cluster) and reads
/// the eviction policy.
async fn prepare(mut connection: Connection) -> Result<(Connection, String), StoreError> {
    Script::new(ADMIT_LUA)
        .prepare_invoke()
        .load_async(&mut connection)
        .await
        .map_err(|err| StoreError::redis(StoreErrorKind::Connect, err))?;
    let policy = read_policy(&mut connection).await?;
    Ok((connection, policy))
}

/// Reads the server's `maxmemory-policy` with `INFO memory`: `Ok("")` when
/// the server answers without it (or refuses `INFO`: the policy is then
/// unknown, and trusted). On a cluster every primary answers, and an
/// evicting one's policy is the one returned.
async fn read_policy(connection: &mut Connection) -> Result<String, StoreError> {
    let info: Result<redis::Value, redis::RedisError> = redis::cmd("INFO")
        .arg("memory")
        .query_async(connection)
        .await;
    match info {
        Ok(info) => Ok(policy_in(&info)),
        // An error reply (INFO refused by an ACL, say): the link works.
        Err(err) if err.code().is_some() => {
            tracing::warn!(
                error = %err,
                "redis store: cannot read the server's maxmemory-policy; make sure it is \
                 noeviction"
            );
            Ok(String::new())
        }
        Err(err) => Err(StoreError::redis(StoreErrorKind::Connect, err)),
    }
}

fn client(url: &str) -> Result<redis::Client, StoreError> {
    redis::Client::open(url).map_err(|err| StoreError::redis(StoreErrorKind::InvalidUrl, err))
}

fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        // Each round trip is bounded by the store's own timeout; the
        // client's (500 ms by default) would only drop the connection.
        .set_response_timeout(None)
        // Reconnection: a few quick tries with backoff; once they are
        // spent, the next command starts another round.
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(500))
        .set_number_of_retries(4)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    /// A reply of four numbers and a policy (`""`: none).
    fn reply(numbers: &[i64], policy: &str) -> Vec<Value> {
        let mut reply: Vec<Value> = numbers.iter().map(|&n| Value::Int(n)).collect();
        reply.push(Value::BulkString(policy.as_bytes().to_vec()));
        reply
    }

    #[test]
    fn replies_of_the_wrong_shape_are_errors() {
        for numbers in [
            &[][..],
            &[1, 2, 0],
            &[2, 1, 0, 5, 9],
            &[4, 1, 0, 5],
            &[1, -1, 0, 5],
            &[0, 1, 0, 5],
            &[0, 1, -7, 5],
            &[1, 1, 30, 5],
            &[0, 1, 30, -5],
            &[2, 0, 30, 5],
            &[3, 0, -1, 0],
        ] {
            let err = parse_reply(reply(numbers, "")).expect_err(&format!("{numbers:?}"));
            assert_eq!(err.kind(), StoreErrorKind::Reply);
        }
        let four = reply(&[1, 1, 0, 5], "")[..4].to_vec();
        assert!(parse_reply(four).is_err(), "the policy is always there");
        let mut number_policy = reply(&[1, 1, 0, 5], "");
        number_policy[4] = Value::Int(7);
        assert!(parse_reply(number_policy).is_err());
    }

    #[test]
    fn lease_replies_carry_what_was_granted_and_only_on_a_pass() {
        let mut lease = reply(&[1, 12, 0, 5_000], "");
        lease.extend([Value::Int(10), Value::Int(1_200), Value::Int(43_500)]);
        let read = parse_reply(lease.clone()).expect("a lease");
        assert!(read.passed);
        assert_eq!(
            read.lease,
            Some(Leased {
                passes: 10,
                bucket_start: 1_200,
                ends_us: 43_500
            })
        );
        assert_eq!(
            parse_reply(reply(&[1, 3, 0, 5], "")).expect("a pass").lease,
            None
        );
        let mut refused = reply(&[0, 5, 40, 5], "");
        refused.extend([Value::Int(1), Value::Int(0), Value::Int(1)]);
        assert!(parse_reply(refused).is_err(), "a refusal leases nothing");
        let mut none = lease.clone();
        none[5] = Value::Int(0);
        assert!(
            parse_reply(none).is_err(),
            "a lease holds the caller's pass"
        );
        let mut negative = lease.clone();
        negative[7] = Value::Int(-1);
        assert!(parse_reply(negative).is_err());
        assert!(parse_reply(lease[..7].to_vec()).is_err());
    }

    #[test]
    fn replies_that_make_sense_are_read() {
        let pass = parse_reply(reply(&[1, 3, 0, 5], "")).expect("a pass");
        assert!(pass.passed);
        assert_eq!((pass.window_pass, pass.limit, pass.wait_ms), (3, 5, None));
        assert_eq!((pass.outcome, pass.policy), (Outcome::Decided, None));
        let block = parse_reply(reply(&[0, 5, 40, 5], "noeviction")).expect("a block");
        assert_eq!((block.passed, block.wait_ms), (false, Some(40)));
        assert_eq!(block.policy.as_deref(), Some("noeviction"));
        let never = parse_reply(reply(&[0, 0, -1, 0], "")).expect("never");
        assert_eq!(never.wait_ms, None);
        let wrong = parse_reply(reply(&[2, 0, -1, 5], "")).expect("wrong type");
        assert_eq!((wrong.outcome, wrong.passed), (Outcome::WrongType, false));
        let evicting = parse_reply(reply(&[3, 0, -1, 0], "allkeys-lru")).expect("evicting");
        assert_eq!(evicting.outcome, Outcome::Evicting);
        assert_eq!(evicting.policy.as_deref(), Some("allkeys-lru"));
    }
}
