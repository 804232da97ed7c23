//! A layer's shared store, if it has one (feature `redis`), with its
//! failure policy and how the layer's keys become store identities.
//!
//! Kept in `store` so that both the layer and its handles can hold it.
//! Without the feature it is an empty placeholder, so the layer's and the
//! handle's fields are the same in every build.

#[cfg(not(feature = "redis"))]
mod disabled {
    use std::marker::PhantomData;

    /// No store: the feature is off.
    pub(crate) struct RemoteSlot<K>(PhantomData<fn(&K)>);

    impl<K> RemoteSlot<K> {
        pub(crate) fn none() -> Self {
            RemoteSlot(PhantomData)
        }

        pub(crate) fn rekey<L>(self) -> RemoteSlot<L> {
            RemoteSlot(PhantomData)
        }
    }

    impl<K> Clone for RemoteSlot<K> {
        fn clone(&self) -> Self {
            RemoteSlot(PhantomData)
        }
    }
}

#[cfg(not(feature = "redis"))]
pub(crate) use disabled::RemoteSlot;

#[cfg(feature = "redis")]
pub(crate) use enabled::{RemoteLookup, RemoteSlot};

#[cfg(feature = "redis")]
mod enabled {
    use std::any::Any;
    use std::borrow::Borrow;
    use std::hash::Hash;
    use std::sync::Arc;

    use crate::key::KeyVisitor;
    use crate::store::redis::{identity, KeyId, RedisStore, StoreFailure, StoreKey};
    use crate::store::{Entry, Lookup};

    /// A layer's shared store, if it has one, and its failure policy.
    pub(crate) struct RemoteSlot<K> {
        pub(crate) remote: Option<Remote<K>>,
        pub(crate) policy: StoreFailure,
    }

    /// The store, and how this layer's keys become store identities.
    pub(crate) struct Remote<K> {
        pub(crate) store: RedisStore,
        identity: fn(&K) -> KeyId,
    }

    impl<K> Clone for Remote<K> {
        fn clone(&self) -> Self {
            Remote {
                store: self.store.clone(),
                identity: self.identity,
            }
        }
    }

    impl<K> Clone for RemoteSlot<K> {
        fn clone(&self) -> Self {
            RemoteSlot {
                remote: self.remote.clone(),
                policy: self.policy,
            }
        }
    }

    impl<K> RemoteSlot<K> {
        pub(crate) fn none() -> Self {
            RemoteSlot {
                remote: None,
                policy: StoreFailure::default(),
            }
        }

        /// The slot for a layer whose key type changes (`key`). A store set
        /// before is kept when the key type stays the same (it names the
        /// new keys as it named the old); for another key type it could not
        /// name the new keys, and is dropped with a `warn` event, as the
        /// layer's rules of another key type are. The failure policy stays.
        pub(crate) fn rekey<L: 'static>(self) -> RemoteSlot<L>
        where
            K: 'static,
        {
            let remote = self.remote.and_then(|remote| {
                let identity: Box<dyn Any> = Box::new(remote.identity);
                match identity.downcast::<fn(&L) -> KeyId>() {
                    Ok(identity) => Some(Remote {
                        store: remote.store,
                        identity: *identity,
                    }),
                    Err(_) => {
                        tracing::warn!(
                            "SlidingWindowLayer::key: the store set before `key` names keys of \
                             the previous key type and is dropped; set the store after `key`"
                        );
                        None
                    }
                }
            });
            RemoteSlot {
                remote,
                policy: self.policy,
            }
        }

        pub(crate) fn with_store(self, store: RedisStore) -> Self
        where
            K: StoreKey,
        {
            RemoteSlot {
                remote: Some(Remote {
                    store,
                    identity: identity::<K>,
                }),
                policy: self.policy,
            }
        }

        /// The store's identity of `key`, if there is a store.
        pub(crate) fn identity_of(&self, key: &K) -> Option<(&RedisStore, KeyId)> {
            self.remote
                .as_ref()
                .map(|remote| (&remote.store, (remote.identity)(key)))
        }
    }

    /// Looks a request's key up in the local table and computes its store
    /// identity in one visit. A borrowed key is made owned for the
    /// identity: one allocation, next to a round trip to Redis.
    pub(crate) struct RemoteLookup<'a, K> {
        pub(crate) lookup: Lookup<'a, K>,
        pub(crate) identity: fn(&K) -> KeyId,
    }

    impl<K: Clone + Eq + Hash + Send + Sync + 'static> KeyVisitor<K> for RemoteLookup<'_, K> {
        type Output = (Arc<Entry>, KeyId);

        fn owned(self, key: K) -> Self::Output {
            let id = (self.identity)(&key);
            (self.lookup.owned(key), id)
        }

        fn borrowed<Q>(self, key: &Q, to_owned: fn(&Q) -> K) -> Self::Output
        where
            K: Borrow<Q>,
            Q: Hash + Eq + ?Sized,
        {
            let id = (self.identity)(&to_owned(key));
            (self.lookup.borrowed(key, to_owned), id)
        }
    }

    impl<K> Remote<K> {
        pub(crate) fn identity_fn(&self) -> fn(&K) -> KeyId {
            self.identity
        }
    }
}
