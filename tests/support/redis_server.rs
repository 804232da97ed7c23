//! A throwaway `redis-server` for the Redis store's tests: on a free
//! loopback port, with a temporary directory, no persistence, stopped (and
//! its directory removed) on drop.
//!
//! The tests that need one are marked `#[ignore = "needs redis-server"]`:
//! `cargo test` leaves them out, and `.ci/run` runs them with
//! `--include-ignored`. When no server can be started, the test fails with
//! the reason: it never passes without having run.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// More `--name value` settings, given at every (re)start.
    settings: Vec<String>,
}

impl RedisServer {
    /// Starts a server.
    ///
    /// # Panics
    ///
    /// When no server can be started here.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with more settings (`["--maxmemory", "2mb"]`).
    ///
    /// # Panics
    ///
    /// When no server can be started here.
    pub fn start_with(settings: &[&str]) -> RedisServer {
        let mut server = RedisServer::not_started(settings);
        if let Err(why) = server.launch() {
            unavailable(&why);
        }
        server
    }

    /// A server with its port and directory chosen, not started yet (its
    /// URL refuses connections until [`begin`](Self::begin)).
    ///
    /// # Panics
    ///
    /// When `redis-server` cannot be run here.
    pub fn not_started(settings: &[&str]) -> RedisServer {
        if let Err(err) = Command::new("redis-server").arg("--version").output() {
            unavailable(&format!("cannot run redis-server: {err}"));
        }
        let dir =
            std::env::temp_dir().join(format!("tsw-redis-{}-{}", std::process::id(), unique()));
        if let Err(err) = std::fs::create_dir_all(&dir) {
            unavailable(&format!("cannot create {}: {err}", dir.display()));
        }
        let port = match free_port() {
            Ok(port) => port,
            Err(err) => unavailable(&format!("no free port: {err}")),
        };
        RedisServer {
            port,
            dir,
            child: None,
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Starts a server made with [`not_started`](Self::not_started).
    pub fn begin(&mut self) {
        self.restart();
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL: no goodbye to clients) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, with empty memory.
    pub fn restart(&mut self) {
        self.kill();
        // The port was just freed; another process could take it, but on a
        // test machine it stays ours. Retry a few times while it lingers.
        let mut last = String::new();
        for _ in 0..20 {
            match self.launch() {
                Ok(()) => return,
                Err(why) => last = why,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}: {last}", self.port);
    }

    fn launch(&mut self) -> Result<(), String> {
        let mut child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--enable-debug-command", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.settings)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("cannot run redis-server: {err}"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("redis-server exited at start: {status}"));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                self.child = Some(child);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!("redis-server did not listen on {addr} within 10 s"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unavailable(why: &str) -> ! {
    panic!(
        "this test needs redis-server: {why} (install it, e.g. `apt-get install redis-server`, \
         and run the ignored tests with `--include-ignored`)"
    );
}

fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A Redis Cluster of throwaway servers: each a [`RedisServer`] with
/// cluster mode on (its `nodes.conf` in its own temporary directory), the
/// slots spread over all of them as primaries with no replicas, by
/// `redis-cli --cluster create`. Stopped with its servers on drop.
///
/// It runs Redis's `redis-server` and `redis-cli` (Debian packages
/// `redis-server` and `redis-tools`); Valkey is not used, Debian 12 has no
/// `valkey-server` package.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `primaries` servers (at least 3, as Redis requires), makes
    /// them one cluster and waits until every node reports
    /// `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// When no cluster can be made here.
    pub fn start(primaries: usize) -> RedisCluster {
        if let Err(err) = Command::new("redis-cli").arg("--version").output() {
            unavailable(&format!("cannot run redis-cli: {err}"));
        }
        let settings = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            // A dead primary is known to the others within a second.
            "--cluster-node-timeout",
            "1000",
        ];
        let nodes: Vec<RedisServer> = (0..primaries)
            .map(|_| RedisServer::start_with(&settings))
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let created = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|err| unavailable(&format!("cannot run redis-cli: {err}")));
        if !created.status.success() {
            unavailable(&format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&created.stdout),
                String::from_utf8_lossy(&created.stderr)
            ));
        }
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.is_ok() {
            if Instant::now() > deadline {
                unavailable("the cluster never reported cluster_state:ok within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// Whether every running node reports `cluster_state:ok`.
    pub fn is_ok(&self) -> bool {
        self.nodes.iter().filter(|n| n.child.is_some()).all(|node| {
            Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &node.port().to_string()])
                .args(["cluster", "info"])
                .output()
                .map(|out| String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok"))
                .unwrap_or(false)
        })
    }

    /// Moves every slot of node `from`, with its keys, to node `to`
    /// (`redis-cli --cluster reshard`): clients that knew the old map are
    /// answered `MOVED` (or `ASK` while a slot is half moved).
    ///
    /// # Panics
    ///
    /// When the move fails.
    pub fn move_all_slots(&self, from: usize, to: usize) {
        let id = |i: usize| {
            let out = Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &self.nodes[i].port().to_string()])
                .args(["cluster", "myid"])
                .output()
                .expect("redis-cli cluster myid");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("reshard")
            .arg(format!("127.0.0.1:{}", self.nodes[from].port()))
            .args(["--cluster-from", &id(from)])
            .args(["--cluster-to", &id(to)])
            .args(["--cluster-slots", "16384"])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster reshard");
        assert!(
            out.status.success(),
            "reshard failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Node `i`.
    pub fn node(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }
}

/// A plain connection for the test to look into Redis (or to slow it
/// down), with no response timeout of its own.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    redis::Client::open(url)
        .expect("valid url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect to the test server")
}
