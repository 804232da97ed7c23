//! The dashboard's JSON shows the rules state.

#![cfg(feature = "dashboard")]

use http::StatusCode;
use serde_json::{json, Value};
use tower_sliding_window::dashboard;
use tower_sliding_window::rules::Rules;
use tower_sliding_window::{PathKey, SlidingWindowLayer};

use crate::support::{req, send};

#[tokio::test]
async fn the_json_shows_the_version_and_the_last_error() {
    let stats = SlidingWindowLayer::qps(10).key(PathKey).handle();
    stats.apply_rules(&Rules::new().limit("/a", 1)).unwrap();
    let _ = stats.apply_rules(&Rules::new().limit("/b", u64::MAX));
    let answer = send(&dashboard::router(stats), req("/stats")).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let s: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        s["rules"],
        json!({
            "version": 1,
            "last_error": format!(
                r#"rules: limits["/b"]: limit must be at most 9007199254740992 (got {})"#,
                u64::MAX
            ),
        })
    );
}
