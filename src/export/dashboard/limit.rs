//! `POST /limit`: a key's limit changed from the page.

use std::hash::Hash;

use axum::body::to_bytes;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::StatusCode;
use serde::Deserialize;

use crate::export::KeyLabel;
use crate::handle::StatsHandle;

/// The largest body read: a key of the longest built-in form (256 bytes,
/// escaped) and a number fit many times over.
pub(super) const MAX_BODY: usize = 4096;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Change {
    /// The key's label (`KeyLabel`); `null` for the missing key.
    key: Option<String>,
    limit: u64,
}

pub(super) async fn change<K>(
    handle: &StatsHandle<K>,
    check: &(dyn Fn(&Parts) -> bool + Send + Sync),
    request: Request,
) -> Response
where
    K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static,
{
    let (parts, body) = request.into_parts();
    // The check runs before a byte of the body is read.
    if !check(&parts) {
        return (StatusCode::FORBIDDEN, "limit changes are not allowed\n").into_response();
    }
    let Ok(bytes) = to_bytes(body, MAX_BODY).await else {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "the body is over 4096 bytes\n",
        )
            .into_response();
    };
    // An object only: serde would also take `["/a", 1]` for the struct.
    let object = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes);
    let parsed = object.and_then(|o| serde_json::from_value(serde_json::Value::Object(o)));
    let change: Change = match parsed {
        Ok(change) => change,
        Err(e) => {
            let message = format!(
                "expected {{\"key\": string or null, \"limit\": whole number from 0 to 2^64-1}}: {e}\n"
            );
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
    };
    // Only a key that has an entry now: the page shows no other, and a
    // label is not parsed back into a key.
    let mut found = None;
    handle.for_each(|key, _| {
        if found.is_none() && key.label().as_deref() == change.key.as_deref() {
            found = Some(key.clone());
        }
    });
    match found {
        Some(key) => {
            handle.set_limit(key, change.limit);
            StatusCode::NO_CONTENT.into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such key\n").into_response(),
    }
}
