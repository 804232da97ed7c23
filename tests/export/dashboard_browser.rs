//! The dashboard in a real browser: headless Chromium loads the page from a
//! running server while load is applied, and the test reads the DOM the
//! page's script built (`--dump-dom`), the table of the clients blocked
//! most included. Also takes a screenshot, and loads the page with 1000
//! keys: it draws the 100 busiest, and a search in its address finds the
//! others. A second page shows hostile keys in the blocked table: as text;
//! a third, a rules error naming a hostile key: as text.
//!
//! The screenshot goes to the test's temporary directory under `target/`;
//! with `DASHBOARD_SCREENSHOT=docs` it replaces the README's
//! `docs/dashboard.png` instead:
//!
//! ```sh
//! DASHBOARD_SCREENSHOT=docs cargo test --all-features --test export dashboard_browser -- --include-ignored
//! ```
//!
//! Needs `chromium`: the test is `#[ignore]`d unless asked for
//! (`.ci/run` installs Chromium and runs it with `--include-ignored`), and
//! then fails, never skips, when Chromium is missing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::Request;
use tokio::net::TcpListener;
use tokio::process::Command;
use tower::ServiceExt;
use tower_sliding_window::{dashboard, PathKey, SlidingWindowLayer, StatsHandle};

/// The browser binary, if one is installed.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// Runs headless Chromium on `url` with `extra` arguments and returns its
/// standard output.
async fn browse(browser: &Path, url: &str, extra: &[&str]) -> (String, String) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let profile = std::env::temp_dir().join(format!(
        "tsw-dashboard-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    let mut command = Command::new(browser);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("chromium finished within 120 s")
        .expect("chromium starts");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        String::from_utf8(output.stdout).expect("UTF-8 DOM"),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The page after its script has run for a few seconds of virtual time
/// (network waits included: virtual time stops while a fetch is pending).
async fn dom(browser: &Path, url: &str) -> String {
    browse(browser, url, &["--virtual-time-budget=2500", "--dump-dom"])
        .await
        .0
}

/// The rows the page drew in the keys table: (class, data-key, the row's
/// cells as text).
fn rows(dom: &str) -> Vec<(String, String, String)> {
    table_rows(dom, "keys")
}

/// The rows the page drew in the table with id `id`.
fn table_rows(dom: &str, id: &str) -> Vec<(String, String, String)> {
    let body = dom
        .split(&format!("<table id=\"{id}\""))
        .nth(1)
        .and_then(|table| table.split("<tbody>").nth(1))
        .and_then(|rest| rest.split("</tbody>").next())
        .unwrap_or_else(|| panic!("no {id} table body in the page:\n{dom}"));
    body.split("<tr ")
        .skip(1)
        .map(|row| {
            let attr = |name: &str| {
                row.split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|v| v.split('"').next())
                    .unwrap_or_default()
                    .to_owned()
            };
            (attr("class"), attr("data-key"), row.to_owned())
        })
        .collect()
}

/// The text of the cell with class `class` in a row.
fn cell<'a>(row: &'a str, class: &str) -> &'a str {
    row.split(&format!("<td class=\"{class}\">"))
        .nth(1)
        .and_then(|v| v.split("</td>").next())
        .unwrap_or_else(|| panic!("no {class} cell in {row}"))
}

struct Server {
    addr: SocketAddr,
    app: Router,
    stats: StatsHandle<String>,
}

async fn serve() -> Server {
    let layer = SlidingWindowLayer::qps(20).key(PathKey).max_keys(2048);
    let stats = layer.handle();
    let app = Router::new()
        .route(
            "/api/{*rest}",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                "ok"
            }),
        )
        // Only matched routes: the browser's favicon request is no key.
        .route_layer(layer);
    let served = app
        .clone()
        .nest("/limits", dashboard::router(stats.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, served).await });
    Server { addr, app, stats }
}

/// Sends requests to a few routes until `stop`, each at its own rate,
/// some over the limit.
fn load(app: Router, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for (route, every) in [("/api/search", 1), ("/api/users", 2), ("/api/login", 5)] {
                if round % every == 0 {
                    let request = Request::get(route).body(Body::empty()).unwrap();
                    let _ = app.clone().oneshot(request).await;
                }
            }
            round += 1;
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    })
}

#[ignore = "needs chromium"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_renders_live_in_chromium() {
    let browser = chromium().expect(
        "this test needs Chromium (Debian: apt-get install chromium); run the ignored tests \
         with --include-ignored once it is installed",
    );
    let server = serve().await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = load(server.app.clone(), Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let url = format!("http://{}/limits", server.addr);
    let first = dom(&browser, &url).await;
    let first_rows = rows(&first);
    for key in ["/api/search", "/api/users", "/api/login"] {
        assert!(
            first_rows
                .iter()
                .any(|(class, k, _)| class == "key" && k == key),
            "{key} is not on the page:\n{first}"
        );
    }
    // The busiest route first, as the JSON orders it.
    assert_eq!(first_rows[0].1, "/api/search", "{first}");
    // Over its limit of 20 per second: the client blocked most, with its
    // blocks over the minute (those of the handle at the read, or fewer).
    let blocked = table_rows(&first, "blocked");
    assert_eq!(blocked[0].1, "/api/search", "{first}");
    let shown: u64 = cell(&blocked[0].2, "blocks").parse().expect("a count");
    let now = server.stats.top_blocked(1)[0].1;
    assert!(
        (1..=now).contains(&shown),
        "{shown} blocks shown, {now} now"
    );
    let search = &first_rows[0].2;
    assert!(cell(search, "limit") == "20", "{search}");
    assert!(search.contains("<polyline class=\"pass\""), "{search}");

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = dom(&browser, &url).await;
    let second_rows = rows(&second);
    let figures = |rows: &[(String, String, String)]| -> Vec<String> {
        rows.iter()
            .map(|(_, key, row)| {
                format!(
                    "{key} {} {} {}",
                    cell(row, "pass"),
                    cell(row, "block"),
                    cell(row, "chart")
                )
            })
            .collect()
    };
    assert_ne!(
        figures(&first_rows),
        figures(&second_rows),
        "the numbers did not change under load"
    );

    // The screenshot (the README's, on request), under the same load.
    let shot = if std::env::var("DASHBOARD_SCREENSHOT").as_deref() == Ok("docs") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/dashboard.png")
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png")
    };
    // An old file must not pass for this run's.
    let _ = std::fs::remove_file(&shot);
    let (_, log) = browse(
        &browser,
        &url,
        &[
            "--window-size=1100,300",
            "--virtual-time-budget=2500",
            &format!("--screenshot={}", shot.display()),
        ],
    )
    .await;
    let png = std::fs::read(&shot)
        .unwrap_or_else(|e| panic!("no screenshot at {} ({e}):\n{log}", shot.display()));
    assert!(png.starts_with(b"\x89PNG"), "a PNG file");
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();

    // 1000 keys: every one gets a row.
    for i in 0..1000 {
        let request = Request::get(format!("/api/bulk/{i}"))
            .body(Body::empty())
            .unwrap();
        server.app.clone().oneshot(request).await.unwrap();
    }
    let keys = server.stats.keys().len();
    assert!(keys >= 1000, "{keys} keys");
    // One refresh period: the next read of the keys sees them all.
    tokio::time::sleep(dashboard::DEFAULT_REFRESH + Duration::from_millis(100)).await;
    let page = dom(&browser, &url).await;
    let drawn = rows(&page);
    // The busiest keys only, however many there are: the three routes
    // under load first, then the bulk keys.
    assert_eq!(drawn.len(), 100, "{} rows for {keys} keys", drawn.len());
    assert!(
        page.contains(&format!("the 100 busiest of {keys} keys")),
        "{page}"
    );
    assert!(
        page.contains(&format!("<b id=\"total-keys\">{keys}</b>")),
        "{page}"
    );
    // No breakers on this layer: a dash in their column.
    assert_eq!(cell(&drawn[0].2, "breaker"), "–");
    // A search in the page's address finds keys outside the top.
    let found = dom(&browser, &format!("{url}?search=/api/bulk/99")).await;
    let mut found: Vec<String> = rows(&found).into_iter().map(|(_, key, _)| key).collect();
    found.sort();
    let mut want: Vec<String> = (990..1000).map(|i| format!("/api/bulk/{i}")).collect();
    want.insert(0, "/api/bulk/99".to_owned());
    assert_eq!(found, want);
    // The searched view, for a look (not compared).
    let searched = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-search.png");
    let _ = std::fs::remove_file(&searched);
    browse(
        &browser,
        &format!("{url}?search=/api/bulk/99"),
        &[
            "--window-size=1100,400",
            "--virtual-time-budget=2500",
            &format!("--screenshot={}", searched.display()),
        ],
    )
    .await;
    let png = std::fs::read(&searched).expect("a screenshot of the search");
    assert!(png.starts_with(b"\x89PNG"), "a PNG file");
}

/// Keys a hostile client chose, blocked: the "Top blocked clients" table
/// shows each as text (markup is not markup, a script in it does not run),
/// the missing key marked, the long key in its bounded form and cut short
/// by the page's style.
#[ignore = "needs chromium"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_top_blocked_keys_render_as_text_in_chromium() {
    let browser = chromium().expect(
        "this test needs Chromium (Debian: apt-get install chromium); run the ignored tests \
         with --include-ignored once it is installed",
    );
    let layer = SlidingWindowLayer::qps(1).key(tower_sliding_window::HeaderKey::new(
        http::HeaderName::from_static("x-client"),
    ));
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let served = Router::new().nest("/limits", dashboard::router(stats.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, served).await });

    let long = "L".repeat(5_000);
    let hostile: [Option<&[u8]>; 5] = [
        Some(b"<img src=x onerror=\"document.title='pwned'\">"),
        Some(b"</td></tr></tbody><script>document.title='pwned'</script>"),
        Some(b"t\xff\xfe\"\\"),
        Some(long.as_bytes()),
        None,
    ];
    for (i, value) in hostile.iter().enumerate() {
        for _ in 0..i + 3 {
            let mut request = Request::get("/");
            if let Some(value) = value {
                request = request.header("x-client", http::HeaderValue::from_bytes(value).unwrap());
            }
            app.clone()
                .oneshot(request.body(Body::empty()).unwrap())
                .await
                .unwrap();
        }
    }
    let page = dom(&browser, &format!("http://{addr}/limits")).await;
    assert!(
        page.contains("<title>Rate limits</title>"),
        "a script ran:\n{page}"
    );
    let blocked = table_rows(&page, "blocked");
    assert_eq!(blocked.len(), 5, "{page}");
    // Most blocks first: the missing key (6), then the long key, the
    // bytes that are not UTF-8, the markup.
    assert_eq!(blocked[0].0, "missing");
    assert!(cell(&blocked[0].2, "blocks") == "6");
    let want = stats.top_blocked(5);
    for (row, (key, count)) in blocked.iter().zip(&want) {
        assert_eq!(cell(&row.2, "blocks"), count.to_string());
        if let Some(key) = key {
            // The key as text: escaped in the attribute and the cell.
            let escaped = key
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;");
            assert!(row.2.contains(&escaped), "{key:?} in {}", row.2);
        }
    }
    let body = page
        .split("<table id=\"blocked\"")
        .nth(1)
        .and_then(|table| table.split("</table>").next())
        .expect("the blocked table");
    assert!(!body.contains("<img"), "markup drawn as markup:\n{body}");
    assert!(!body.contains("<script"), "markup drawn as markup:\n{body}");
    let long_row = &blocked[1].2;
    assert!(
        long_row.contains("LLLL") && long_row.contains("…#"),
        "{long_row}"
    );
    assert!(!long_row.contains(&"L".repeat(65)), "{long_row}");
}

/// The rules state in the page's summary: the version, and the last error
/// as text even when a hostile key makes it markup.
#[ignore = "needs chromium"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_error_renders_as_text_in_chromium() {
    let browser = chromium().expect(
        "this test needs Chromium (Debian: apt-get install chromium); run the ignored tests \
         with --include-ignored once it is installed",
    );
    let stats = SlidingWindowLayer::qps(5).key(PathKey).handle();
    let rules = tower_sliding_window::rules::Rules::new();
    stats.apply_rules(&rules.clone().limit("/a", 1)).unwrap();
    let hostile = "<img src=x onerror=\"document.title='pwned'\">";
    let err = stats
        .apply_rules(&rules.limit(hostile, u64::MAX))
        .unwrap_err();
    let served = Router::new().nest("/limits", dashboard::router(stats.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, served).await });

    let page = dom(&browser, &format!("http://{addr}/limits")).await;
    assert!(
        page.contains("<title>Rate limits</title>"),
        "a script ran:\n{page}"
    );
    assert!(page.contains(r#"<b id="rules-version">v1</b>"#), "{page}");
    let escaped = err
        .to_string()
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    assert!(
        page.contains(&format!(
            r#"<small id="rules-error" class="error">{escaped}</small>"#
        )),
        "{escaped} in\n{page}"
    );
}
