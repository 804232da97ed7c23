//! A throwaway `redis-server` for the Redis store's tests: on a free
//! loopback port, with a temporary directory, no persistence, stopped (and
//! its directory removed) on drop.
//!
//! The tests that need one are marked `#[ignore = "needs redis-server"]`:
//! `cargo test` leaves them out, and `.ci/run` runs them with
//! `--include-ignored`. When no server can be started, the test fails with
//! the reason: it never passes without having run.
//!
//! `REDIS_SERVER_BIN` and `REDIS_CLI_BIN` name other binaries to run in
//! place of `redis-server` and `redis-cli`: `.ci/run` runs the suites on
//! Valkey that way where its Debian package exists. The server binary must
//! be the server process itself (or `exec` it): a server counts as started
//! only once `INFO server` on its port names the child's process id.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server binary: `REDIS_SERVER_BIN`, else `redis-server`.
fn server_bin() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

/// The command-line client: `REDIS_CLI_BIN`, else `redis-cli`.
fn cli_bin() -> String {
    std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".to_owned())
}

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
        // The port was free when it was chosen; another test's server or
        // connection may take it before ours binds it. A first start may
        // move to another port (no one knows this one yet).
        let mut last = String::new();
        for _ in 0..5 {
            match server.launch() {
                Ok(()) => return server,
                Err(why) => last = why,
            }
            server.port = match free_port() {
                Ok(port) => port,
                Err(err) => unavailable(&format!("no free port: {err}")),
            };
        }
        unavailable(&last)
    }

    /// A server with its port and directory chosen, not started yet (its
    /// URL refuses connections until [`begin`](Self::begin)).
    ///
    /// # Panics
    ///
    /// When `redis-server` cannot be run here.
    pub fn not_started(settings: &[&str]) -> RedisServer {
        if let Err(err) = Command::new(server_bin()).arg("--version").output() {
            unavailable(&format!("cannot run {}: {err}", server_bin()));
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

    /// Stops the server for a while without closing anything (SIGSTOP):
    /// its connections stay open and it answers nothing until
    /// [`resume`](Self::resume).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a [`pause`](Self::pause)d server run again (SIGCONT): it
    /// answers what it was sent meanwhile.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("a running server");
        // The shell's own `kill`: no package beyond a shell needed.
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("kill {signal} {}", child.id()))
            .status()
            .expect("run sh");
        assert!(status.success(), "kill {signal} {}: {status}", child.id());
    }

    /// Whether the server runs (it was not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
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
        let mut child = Command::new(server_bin())
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
            if let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
                // Something listens: ours, or another test's server that
                // took the port first (ours then fails to bind and exits).
                match served_by(stream) {
                    Some(pid) if pid == child.id() => {
                        self.child = Some(child);
                        return Ok(());
                    }
                    Some(pid) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(format!(
                            "{addr} is served by process {pid}, not by redis-server {}",
                            child.id()
                        ));
                    }
                    // No answer yet (a slow start on a loaded machine):
                    // ask again while the deadline allows.
                    None => {}
                }
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

/// The `process_id` of the Redis server at the other end of `stream`
/// (from `INFO server`), or `None` if it does not answer as one within a
/// second.
fn served_by(mut stream: TcpStream) -> Option<u32> {
    use std::io::{Read, Write};
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream
        .write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
        .ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&reply);
        if let Some((_, after)) = text.split_once("process_id:") {
            // Only a whole line: the rest of the number may still be on
            // its way.
            if let Some((pid, _)) = after.split_once("\r\n") {
                return pid.parse().ok();
            }
        }
    }
    None
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
/// slots spread over the primaries, each with its replicas if asked for,
/// by `redis-cli --cluster create`. Stopped with its servers on drop.
///
/// It runs Redis's `redis-server` and `redis-cli` (Debian packages
/// `redis-server` and `redis-tools`), or the binaries `REDIS_SERVER_BIN`
/// and `REDIS_CLI_BIN` name (Valkey's, where `.ci/run` finds its package).
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `primaries` servers (at least 3, as Redis requires) with no
    /// replicas, and a node timeout of 1 s; see [`start_with`](Self::start_with).
    ///
    /// # Panics
    ///
    /// When no cluster can be made here.
    pub fn start(primaries: usize) -> RedisCluster {
        RedisCluster::start_with(primaries, 0, 1000)
    }

    /// Starts `primaries` servers, each with `replicas` replicas, makes
    /// them one cluster, and waits until every node reports
    /// `cluster_state:ok` and every replica has synced. A node that does
    /// not answer its peers for `node_timeout_ms` is failed: its replica
    /// takes over, or (with none) the cluster stops serving until it is
    /// back.
    ///
    /// # Panics
    ///
    /// When no cluster can be made here.
    pub fn start_with(primaries: usize, replicas: usize, node_timeout_ms: u64) -> RedisCluster {
        if let Err(err) = Command::new(cli_bin()).arg("--version").output() {
            unavailable(&format!("cannot run {}: {err}", cli_bin()));
        }
        let node_timeout = node_timeout_ms.to_string();
        let settings = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &node_timeout,
        ];
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| RedisServer::start_with(&settings))
            .collect();
        let mut create = Command::new(cli_bin());
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let created = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|err| unavailable(&format!("cannot run {}: {err}", cli_bin())));
        if !created.status.success() {
            unavailable(&format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&created.stdout),
                String::from_utf8_lossy(&created.stderr)
            ));
        }
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.is_ok() || cluster.synced_replicas() < primaries * replicas {
            if Instant::now() > deadline {
                unavailable("the cluster never reported cluster_state:ok within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// `redis-cli -p <node i's port> args...`: its output, or `None` when
    /// it fails (a dead node). Not for a paused node: it would wait.
    pub fn cli(&self, i: usize, args: &[&str]) -> Option<String> {
        let out = Command::new(cli_bin())
            .args(["-h", "127.0.0.1", "-p", &self.nodes[i].port().to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
    }

    /// Whether every running node reports `cluster_state:ok`.
    pub fn is_ok(&self) -> bool {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running())
            .all(|i| {
                self.cli(i, &["cluster", "info"])
                    .is_some_and(|info| info.contains("cluster_state:ok"))
            })
    }

    /// Replicas whose link to their primary is up and in sync.
    fn synced_replicas(&self) -> usize {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running())
            .filter(|&i| {
                self.cli(i, &["info", "replication"]).is_some_and(|info| {
                    info.contains("role:slave")
                        && info.contains("master_link_status:up")
                        && info.contains("master_sync_in_progress:0")
                })
            })
            .count()
    }

    /// The nodes that serve slots now (running primaries), by index, as
    /// node `from` sees the cluster.
    pub fn primaries(&self) -> Vec<usize> {
        let from = (0..self.nodes.len())
            .find(|&i| self.nodes[i].is_running())
            .expect("a running node");
        let nodes = self
            .cli(from, &["cluster", "nodes"])
            .expect("cluster nodes");
        let mut primaries: Vec<usize> = nodes
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let flags = fields.get(2)?;
                // `<id> <ip:port@bus> <flags> <primary> ... <slots>`
                if !flags.contains("master") || flags.contains("fail") || fields.len() < 9 {
                    return None;
                }
                let port: u16 = fields[1].split(['@', ':']).nth(1)?.parse().ok()?;
                let i = self.nodes.iter().position(|n| n.port() == port)?;
                self.nodes[i].is_running().then_some(i)
            })
            .collect();
        primaries.sort_unstable();
        primaries
    }

    /// Waits until every write a running primary has taken is on its
    /// replicas (their offsets equal the primary's).
    ///
    /// # Panics
    ///
    /// When they have not caught up within 10 s.
    pub fn wait_replicated(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for i in self.primaries() {
            loop {
                let info = self.cli(i, &["info", "replication"]).expect("info");
                let field = |name: &str| -> Option<String> {
                    info.lines()
                        .find_map(|line| line.trim().strip_prefix(name))
                        .map(str::to_owned)
                };
                let offset = field("master_repl_offset:").expect("an offset");
                let replicas: Vec<String> = info
                    .lines()
                    .filter(|line| line.starts_with("slave"))
                    .filter_map(|line| {
                        let at = line.find("offset=")? + "offset=".len();
                        Some(line[at..].split(',').next()?.to_owned())
                    })
                    .collect();
                if replicas.iter().all(|o| *o == offset) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {i}: replicas {replicas:?} behind offset {offset}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The node id of node `i`.
    pub fn id(&self, i: usize) -> String {
        self.cli(i, &["cluster", "myid"])
            .expect("cluster myid")
            .trim()
            .to_owned()
    }

    /// Moves every slot of node `from`, with its keys, to node `to`
    /// (`redis-cli --cluster reshard`): clients that knew the old map are
    /// answered `MOVED` (or `ASK` while a slot is half moved).
    ///
    /// # Panics
    ///
    /// When the move fails.
    pub fn move_all_slots(&self, from: usize, to: usize) {
        let out = Command::new(cli_bin())
            .arg("--cluster")
            .arg("reshard")
            .arg(format!("127.0.0.1:{}", self.nodes[from].port()))
            .args(["--cluster-from", &self.id(from)])
            .args(["--cluster-to", &self.id(to)])
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
