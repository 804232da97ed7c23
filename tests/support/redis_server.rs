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
