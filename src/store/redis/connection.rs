//! The store's connection: to one server, or (feature `redis-cluster`) to
//! a Redis Cluster. Both reconnect on their own; the cluster client also
//! follows `MOVED` and `ASK` redirections and routes each script call to
//! the node that holds its keys' slot (a key's two names share one hash
//! tag, so one slot).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection the store's commands and script calls go through; clones
/// share it.
#[derive(Clone)]
pub(super) enum Connection {
    /// One server, through a connection manager.
    Single(ConnectionManager),
    /// A cluster: one connection per node, commands routed by slot.
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(connection) => connection.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(connection) => connection.get_db(),
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(connection) => connection.get_db(),
        }
    }
}

/// The `maxmemory-policy` an `INFO memory` reply names: a string from one
/// server, a map of node to string from a cluster. On a cluster, an
/// evicting node's policy wins (one is enough to lose windows); `""` when
/// no node names one.
pub(super) fn policy_in(info: &Value) -> String {
    let mut policies = Vec::new();
    collect_policies(info, &mut policies);
    policies
        .iter()
        .find(|policy| policy.as_str() != "noeviction")
        .or(policies.first())
        .cloned()
        .unwrap_or_default()
}

fn collect_policies(value: &Value, into: &mut Vec<String>) {
    let text = match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes),
        Value::SimpleString(text) => text.as_str().into(),
        Value::VerbatimString { text, .. } => text.as_str().into(),
        Value::Map(pairs) => {
            for (_, value) in pairs {
                collect_policies(value, into);
            }
            return;
        }
        Value::Array(values) | Value::Set(values) => {
            for value in values {
                collect_policies(value, into);
            }
            return;
        }
        _ => return,
    };
    if let Some(policy) = text
        .lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
    {
        into.push(policy.trim().to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(policy: &str) -> Value {
        Value::BulkString(
            format!("# Memory\r\nused_memory:1\r\nmaxmemory_policy:{policy}\r\n").into_bytes(),
        )
    }

    #[test]
    fn one_servers_policy_is_read() {
        assert_eq!(policy_in(&info("noeviction")), "noeviction");
        assert_eq!(policy_in(&info("allkeys-lru")), "allkeys-lru");
        assert_eq!(policy_in(&Value::BulkString(b"# Memory\r\n".to_vec())), "");
        assert_eq!(policy_in(&Value::Int(3)), "");
    }

    #[test]
    fn one_evicting_node_is_enough() {
        let node = |addr: &str, policy: &str| (Value::SimpleString(addr.to_owned()), info(policy));
        let all_fine = Value::Map(vec![
            node("127.0.0.1:7000", "noeviction"),
            node("127.0.0.1:7001", "noeviction"),
        ]);
        assert_eq!(policy_in(&all_fine), "noeviction");
        let one_evicts = Value::Map(vec![
            node("127.0.0.1:7000", "noeviction"),
            node("127.0.0.1:7001", "volatile-lru"),
            node("127.0.0.1:7002", "noeviction"),
        ]);
        assert_eq!(policy_in(&one_evicts), "volatile-lru");
    }
}
