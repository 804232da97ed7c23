//! `RulesWatcher`: a thread that re-applies a rules file when it changes.
//!
//! # Implementation details
//!
//! One thread per watcher, fed by one channel. The operating system's
//! watcher (through `notify`) watches the file's directory, not the file:
//! an editor that saves by writing a new file and renaming it over the old
//! one, and a Kubernetes ConfigMap volume, which swaps its `..data` symlink
//! to a new directory, both replace the file's directory entry, which a
//! watch on the old file would never see. Every event in the directory
//! wakes the thread, which waits until events stop for [`SETTLE`] (so that
//! a file written in several steps is read once, whole), then reads the
//! file (following symlinks) and applies it if its bytes differ from the
//! last ones read. Unrelated files in the directory cost one read of the
//! rules file each burst, and apply nothing.
//!
//! A file written in place is truncated first and filled after: a read in
//! between sees it empty or cut short, and an empty document is a valid
//! one that would drop every per-key limit until the next read. So bytes
//! that changed are read a second time [`STABLE`] later and applied only
//! if both reads agree and the file's modification time did not move in
//! between (two saves can both be caught just truncated, empty and equal);
//! otherwise the next event or tick reads them again.
//! A writer stalled between truncating and writing for longer than that
//! can still be read half written: only a rename replaces a file at once.
//!
//! Without events (no backend on this system, the watch failed, or
//! [`force_polling`](RulesWatcherBuilder::force_polling)), the thread reads
//! the file every [`poll_interval`](RulesWatcherBuilder::poll_interval)
//! instead. With events it still reads it every [`RECHECK`], in case an
//! event was lost (the directory itself replaced, a full event queue).
//!
//! Dropping the watcher stops the system watcher (which drops its sender),
//! sends `Stop` and joins the thread: nothing outlives the watcher. The
//! thread reads at most [`MAX_RULES_FILE_BYTES`] plus one byte of a file,
//! and a parser that panics is caught and reported as a parse error.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use notify::Watcher as _;

use super::{RuleKey, Rules, RulesError, RulesErrorKind};
use crate::StatsHandle;

/// The largest rules file a watcher reads: 1 MiB. A larger file is refused
/// with a [`TooLarge`](RulesErrorKind::TooLarge) error, reading no more than
/// this plus one byte of it; the last rules applied stay.
pub const MAX_RULES_FILE_BYTES: u64 = 1 << 20;

/// How long events must stop before the file is read.
const SETTLE: Duration = Duration::from_millis(50);

/// The gap between the two reads that must agree before changed bytes
/// are applied.
const STABLE: Duration = Duration::from_millis(100);

/// The longest a burst of events delays a read.
const MAX_SETTLE: Duration = Duration::from_secs(1);

/// With events, how often the file is read anyway.
const RECHECK: Duration = Duration::from_secs(30);

/// Default [`poll_interval`](RulesWatcherBuilder::poll_interval).
const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Longest parse error message kept: a parser may quote the line it failed
/// on, and a hostile file's line can be a megabyte.
const MAX_REASON_BYTES: usize = 512;

/// Reads a rules file's text into a [`Rules`] document.
///
/// [`toml`](Self::toml) and [`json`](Self::json) are built in, and are
/// chosen by the file's extension (`.toml`, `.json`) when no parser is
/// given. Any other format through [`new`](Self::new), for example YAML
/// with a YAML crate: `RulesParser::new(|text| serde_yaml_ng::from_str(text).map_err(|e| e.to_string()))`.
#[derive(Clone)]
pub struct RulesParser {
    name: &'static str,
    parse: Arc<ParseFn>,
}

/// A parser's function: the file's text to a document, or why not.
type ParseFn = dyn Fn(&str) -> Result<Rules, String> + Send + Sync;

impl RulesParser {
    /// TOML.
    pub fn toml() -> Self {
        RulesParser {
            name: "toml",
            parse: Arc::new(|text| toml::from_str(text).map_err(|e| e.to_string())),
        }
    }

    /// JSON.
    pub fn json() -> Self {
        RulesParser {
            name: "json",
            parse: Arc::new(|text| serde_json::from_str(text).map_err(|e| e.to_string())),
        }
    }

    /// Any format: `parse` reads the file's text, or says why it cannot.
    pub fn new(parse: impl Fn(&str) -> Result<Rules, String> + Send + Sync + 'static) -> Self {
        RulesParser {
            name: "custom",
            parse: Arc::new(parse),
        }
    }

    /// The built-in parser for `path`'s extension, if there is one.
    fn for_path(path: &Path) -> Option<Self> {
        let extension = path.extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "toml" => Some(Self::toml()),
            "json" => Some(Self::json()),
            _ => None,
        }
    }
}

impl fmt::Debug for RulesParser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RulesParser").field(&self.name).finish()
    }
}

/// How a [`RulesWatcher`] starts; from [`RulesWatcher::builder`].
#[derive(Debug, Clone)]
pub struct RulesWatcherBuilder {
    path: PathBuf,
    parser: Option<RulesParser>,
    poll_interval: Duration,
    force_polling: bool,
}

impl RulesWatcherBuilder {
    /// Reads the file with `parser` (default: by the file's extension,
    /// `.toml` or `.json`).
    pub fn parser(mut self, parser: RulesParser) -> Self {
        self.parser = Some(parser);
        self
    }

    /// How often the file is read when the system gives no events
    /// (default 1 s).
    ///
    /// # Panics
    ///
    /// When `interval` is zero.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        assert!(
            !interval.is_zero(),
            "RulesWatcherBuilder::poll_interval: invalid `interval`: must be greater than 0"
        );
        self.poll_interval = interval;
        self
    }

    /// Polls the file every [`poll_interval`](Self::poll_interval) rather
    /// than listening for the system's events (for file systems that give
    /// none, such as some network mounts).
    pub fn force_polling(mut self) -> Self {
        self.force_polling = true;
        self
    }

    /// Reads and applies the file now, then starts the watcher.
    ///
    /// # Errors
    ///
    /// When no parser reads the file's extension, or the file cannot be
    /// read, parsed or applied now: nothing is applied, no thread is left
    /// running, and the error is also the handle's
    /// [`last_error`](super::RulesStatus::last_error). A file that goes
    /// wrong later keeps the last rules applied (see [`RulesWatcher`]).
    pub fn start<K>(self, handle: &StatsHandle<K>) -> Result<RulesWatcher, RulesError>
    where
        K: RuleKey + Clone + Eq + std::hash::Hash + Send + Sync + 'static,
    {
        let shown = self.path.display().to_string();
        let Some(parser) = self.parser.or_else(|| RulesParser::for_path(&self.path)) else {
            let err = RulesError::file(
                RulesErrorKind::Parse,
                shown,
                "no parser for this file's extension (built in: .toml, .json): give one \
                 with `RulesWatcherBuilder::parser`",
            );
            handle.rules_failed(&err);
            return Err(err);
        };
        let mut reader = Reader {
            path: self.path.clone(),
            shown,
            parser,
            handle: handle.clone(),
            last: None,
        };
        let directory = match self.path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // Events from here on wait in the channel: a change made while the
        // file is read below is read again by the thread.
        let (sender, receiver) = mpsc::channel();
        let system = if self.force_polling {
            None
        } else {
            system_watcher(&directory, sender.clone())
        };
        // On an error, `system` is dropped on return: nothing keeps running.
        reader.reload()?;
        let wait = if system.is_some() {
            RECHECK
        } else {
            self.poll_interval
        };
        let thread = std::thread::Builder::new()
            .name("rules-watcher".to_owned())
            .spawn(move || run(reader, receiver, wait))
            .map_err(|err| {
                RulesError::file(
                    RulesErrorKind::Watch,
                    self.path.display().to_string(),
                    format!("could not start the watcher's thread: {err}"),
                )
            })?;
        Ok(RulesWatcher {
            path: self.path,
            polling: system.is_none(),
            system,
            stop: sender,
            thread: Some(thread),
        })
    }
}

/// Starts the system's watcher on `directory`, sending a wake-up for every
/// event; `None` when there is none or it cannot watch.
fn system_watcher(directory: &Path, sender: Sender<Message>) -> Option<notify::RecommendedWatcher> {
    let handler = move |event: notify::Result<notify::Event>| {
        use notify::event::{AccessKind, AccessMode, EventKind};
        // Opening or reading a file changes nothing, and the thread's own
        // reads would wake it again; a file closed after writing has
        // changed. An error from the backend (a full queue) may hide a
        // change: read the file as for any other event.
        if let Ok(event) = &event {
            if let EventKind::Access(access) = event.kind {
                if access != AccessKind::Close(AccessMode::Write) {
                    return;
                }
            }
        }
        // A send fails only once the watcher is stopping.
        let _ = sender.send(Message::Changed);
    };
    let started = notify::recommended_watcher(handler).and_then(|mut watcher| {
        watcher.watch(directory, notify::RecursiveMode::NonRecursive)?;
        Ok(watcher)
    });
    match started {
        Ok(watcher) => Some(watcher),
        Err(err) => {
            tracing::warn!(
                directory = %directory.display(),
                error = %err,
                "rules watcher: no file events here; polling the file instead"
            );
            None
        }
    }
}

/// Re-applies a rules file whenever it changes, until dropped; from
/// [`StatsHandle::watch_rules`] or [`RulesWatcher::builder`].
///
/// - It watches the file's directory, so that a file replaced by a rename
///   (as editors save, and as Kubernetes updates a ConfigMap volume by
///   swapping its `..data` symlink) is seen as well as one written in
///   place. Where the system gives no file events, it polls the file (see
///   [`poll_interval`](RulesWatcherBuilder::poll_interval)).
/// - Changed bytes are applied once two reads 100 ms apart agree, so a
///   file written in place is not read half written (an empty document
///   would drop every per-key limit). Only a rename replaces a file at
///   once: a writer that stalls for longer than that between truncating
///   and writing can still be caught; deploy rules by renaming a file
///   written beside it.
/// - A file that is missing, larger than [`MAX_RULES_FILE_BYTES`], not
///   UTF-8, not a rules document, or with a rule that does not validate
///   changes nothing: the last rules applied stay, the error is the
///   handle's [`last_error`](super::RulesStatus::last_error) (and a
///   `tracing` warning), and the next good file is applied.
/// - Each file applied adds one to the handle's
///   [`version`](super::RulesStatus::version). A file is applied again only
///   when its bytes differ from the last ones read (or after a read
///   failed).
/// - Dropping it stops its thread and waits for it (at most the read of
///   one file).
///
/// ```
/// use std::time::{Duration, Instant};
/// use tower_sliding_window::{PathKey, SlidingWindowLayer};
///
/// let dir = std::env::temp_dir().join(format!("rules-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("rules.toml");
/// std::fs::write(&path, "default = 100\n[limits]\n\"/login\" = 5\n").unwrap();
///
/// let layer = SlidingWindowLayer::qps(10).key(PathKey);
/// let stats = layer.handle();
/// let watcher = stats.watch_rules(&path).unwrap(); // applied once, now
/// assert_eq!(stats.rules_status().version, 1);
///
/// // Replaced by a rename, as editors save:
/// std::fs::write(dir.join("rules.toml.tmp"), "[limits]\n\"/login\" = 3\n").unwrap();
/// std::fs::rename(dir.join("rules.toml.tmp"), &path).unwrap();
/// let deadline = Instant::now() + Duration::from_secs(10);
/// while stats.rules_status().version < 2 && Instant::now() < deadline {
///     std::thread::sleep(Duration::from_millis(10));
/// }
/// assert_eq!(stats.rules_status().version, 2);
/// drop(watcher); // stops watching
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub struct RulesWatcher {
    path: PathBuf,
    polling: bool,
    /// Dropped first: its thread holds a sender of the channel.
    system: Option<notify::RecommendedWatcher>,
    stop: Sender<Message>,
    thread: Option<JoinHandle<()>>,
}

impl RulesWatcher {
    /// A watcher of the rules file at `path`, to [`start`](RulesWatcherBuilder::start).
    pub fn builder(path: impl Into<PathBuf>) -> RulesWatcherBuilder {
        RulesWatcherBuilder {
            path: path.into(),
            parser: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            force_polling: false,
        }
    }

    /// The file watched.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it polls the file rather than listening for events.
    pub fn is_polling(&self) -> bool {
        self.polling
    }
}

impl fmt::Debug for RulesWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RulesWatcher")
            .field("path", &self.path)
            .field("polling", &self.polling)
            .finish_non_exhaustive()
    }
}

impl Drop for RulesWatcher {
    fn drop(&mut self) {
        // Stops the backend's thread and drops its sender.
        drop(self.system.take());
        let _ = self.stop.send(Message::Stop);
        if let Some(thread) = self.thread.take() {
            // The thread catches its parser's panics; a join error could
            // only come from one it did not, and is not ours to raise.
            let _ = thread.join();
        }
    }
}

/// What wakes the watcher's thread.
#[derive(Debug)]
enum Message {
    Changed,
    Stop,
}

/// The thread: reads the file after each burst of events, or every `wait`.
fn run<K>(mut reader: Reader<K>, receiver: Receiver<Message>, wait: Duration)
where
    K: RuleKey + Clone + Eq + std::hash::Hash + Send + Sync + 'static,
{
    loop {
        match receiver.recv_timeout(wait) {
            Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
            Ok(Message::Changed) => {
                // Wait until the events stop (a file written in steps).
                let start = Instant::now();
                loop {
                    match receiver.recv_timeout(SETTLE) {
                        Ok(Message::Changed) if start.elapsed() < MAX_SETTLE => {}
                        Ok(Message::Changed) | Err(RecvTimeoutError::Timeout) => break,
                        Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            }
        }
        // Errors are recorded on the handle and logged by `reload`.
        let _ = reader.reload();
    }
}

/// Reads, parses and applies the file.
struct Reader<K> {
    path: PathBuf,
    shown: String,
    parser: RulesParser,
    handle: StatsHandle<K>,
    /// The bytes of the last read that succeeded (whatever came of them).
    last: Option<Vec<u8>>,
}

impl<K> Reader<K>
where
    K: RuleKey + Clone + Eq + std::hash::Hash + Send + Sync + 'static,
{
    /// Applies the file if its bytes changed; an error is recorded on the
    /// handle and logged, and leaves the rules as they are.
    fn reload(&mut self) -> Result<(), RulesError> {
        let outcome = self.try_reload();
        if let Err(err) = &outcome {
            if err.kind() != RulesErrorKind::Invalid {
                // `apply_rules` records its own errors.
                self.handle.rules_failed(err);
            }
            tracing::warn!(error = %err, "rules watcher: the file was not applied; the last rules applied stay");
        }
        outcome
    }

    fn try_reload(&mut self) -> Result<(), RulesError> {
        let (bytes, stamp) = match self.read() {
            Ok(read) => read,
            Err(err) => {
                self.last = None;
                return Err(err);
            }
        };
        if self.last.as_deref() == Some(&bytes[..]) {
            return Ok(());
        }
        // Changed bytes may be a file caught half written: apply them only
        // if nothing wrote the file since and they read the same again (see
        // the module docs).
        std::thread::sleep(STABLE);
        match self.read() {
            Ok((again, again_stamp)) if again_stamp == stamp && again == bytes => {}
            // Still changing, or gone: the next event or tick looks again.
            _ => return Ok(()),
        }
        let result = self.apply(&bytes);
        self.last = Some(bytes);
        result
    }

    fn apply(&self, bytes: &[u8]) -> Result<(), RulesError> {
        let text = std::str::from_utf8(bytes).map_err(|err| {
            self.error(
                RulesErrorKind::Parse,
                format!("not UTF-8 (invalid bytes at offset {})", err.valid_up_to()),
            )
        })?;
        let parse = &self.parser.parse;
        let rules = match catch_unwind(AssertUnwindSafe(|| parse(text))) {
            Ok(Ok(rules)) => rules,
            Ok(Err(reason)) => return Err(self.error(RulesErrorKind::Parse, cut(reason))),
            Err(_) => {
                return Err(self.error(RulesErrorKind::Parse, "the parser panicked".to_owned()))
            }
        };
        let version = self.handle.apply_rules(&rules)?;
        tracing::info!(file = %self.shown, version, "rules watcher: rules applied");
        Ok(())
    }

    /// The file's bytes (at most [`MAX_RULES_FILE_BYTES`]) and its
    /// modification time as the read began (where the system keeps one),
    /// or an error.
    fn read(&self) -> Result<(Vec<u8>, Option<SystemTime>), RulesError> {
        let read_error = |err: std::io::Error| self.error(RulesErrorKind::Read, err.to_string());
        // Only a regular file (through symlinks): opening a FIFO would
        // block the thread, and a drop waiting for it, until a writer came.
        if !std::fs::metadata(&self.path).map_err(read_error)?.is_file() {
            return Err(self.error(RulesErrorKind::Read, "not a regular file".to_owned()));
        }
        let file = File::open(&self.path).map_err(read_error)?;
        let too_large = |size: String| {
            self.error(
                RulesErrorKind::TooLarge,
                format!(
                    "the file is {size} bytes; a rules file must be at most \
                     {MAX_RULES_FILE_BYTES} bytes (1 MiB)"
                ),
            )
        };
        let metadata = file.metadata().map_err(read_error)?;
        // Taken before the read: a write after it changes the next stamp.
        let stamp = metadata.modified().ok();
        let size = metadata.len();
        if size > MAX_RULES_FILE_BYTES {
            return Err(too_large(size.to_string()));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        // One byte more than allowed tells a file that grew since.
        file.take(MAX_RULES_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if bytes.len() as u64 > MAX_RULES_FILE_BYTES {
            return Err(too_large(format!("more than {MAX_RULES_FILE_BYTES}")));
        }
        Ok((bytes, stamp))
    }

    fn error(&self, kind: RulesErrorKind, reason: String) -> RulesError {
        RulesError::file(kind, self.shown.clone(), reason)
    }
}

/// `reason`, cut to [`MAX_REASON_BYTES`] at a character boundary.
fn cut(mut reason: String) -> String {
    if reason.len() > MAX_REASON_BYTES {
        let mut end = MAX_REASON_BYTES;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        reason.push('…');
    }
    reason
}

/// # Rules from a file (feature `rules-file`)
#[cfg_attr(docsrs, doc(cfg(feature = "rules-file")))]
impl<K> StatsHandle<K>
where
    K: RuleKey + Clone + Eq + std::hash::Hash + Send + Sync + 'static,
{
    /// Applies the rules file at `path` now, then again whenever it
    /// changes, until the returned [`RulesWatcher`] is dropped. The format
    /// is chosen by the extension (`.toml`, `.json`); other formats and
    /// settings through [`RulesWatcher::builder`].
    ///
    /// # Errors
    ///
    /// When the file cannot be read, parsed or applied now (see
    /// [`RulesWatcherBuilder::start`]).
    pub fn watch_rules(&self, path: impl Into<PathBuf>) -> Result<RulesWatcher, RulesError> {
        RulesWatcher::builder(path).start(self)
    }
}
