//! `POST /limit`: a key's limit changed from the page.

use std::hash::Hash;

use axum::body::to_bytes;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::header::{CONTENT_TYPE, HOST, ORIGIN};
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
    // The checks run before a byte of the body is read.
    if !check(&parts) {
        return (StatusCode::FORBIDDEN, "limit changes are not allowed\n").into_response();
    }
    if let Err((status, why)) = same_origin(&parts) {
        return (status, format!("{why}\n")).into_response();
    }
    let Ok(bytes) = to_bytes(body, MAX_BODY).await else {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "the body is over 4096 bytes\n",
        )
            .into_response();
    };
    // An object only: serde would also take `["/a", 1]` for the struct.
    // Read straight into the struct (not through a map, which keeps the
    // last of two equal names): a field given twice is refused.
    let object = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let parsed = match object {
        true => serde_json::from_slice::<Change>(&bytes).map_err(|e| e.to_string()),
        false => Err("not a JSON object".to_owned()),
    };
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

/// Refuses what a page on another site can make a browser send with the
/// user's cookies and no preflight: a body that is not `application/json`
/// (a form or `text/plain` is sent cross-site without asking),
/// `Sec-Fetch-Site` other than `same-origin` or `none` (the browser says
/// the request comes from another site), or an `Origin` whose host and
/// port are not the request's own `Host`. Requests without `Origin` and
/// `Sec-Fetch-Site` (curl, scripts) pass on the content type alone. The
/// refusal is its status and reason.
fn same_origin(parts: &Parts) -> Result<(), (StatusCode, &'static str)> {
    let refuse = |status: StatusCode, why: &'static str| Err((status, why));
    let json = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "limit changes take content-type: application/json",
        );
    }
    if let Some(site) = parts.headers.get("sec-fetch-site") {
        if site != "same-origin" && site != "none" {
            return refuse(
                StatusCode::FORBIDDEN,
                "limit changes are refused from another site (sec-fetch-site)",
            );
        }
    }
    if let Some(origin) = parts.headers.get(ORIGIN) {
        let host = parts
            .headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| parts.uri.authority().map(|a| a.as_str()));
        let same = match (origin.to_str().ok(), host) {
            (Some(origin), Some(host)) => origin_is_host(origin, host),
            _ => false,
        };
        if !same {
            return refuse(
                StatusCode::FORBIDDEN,
                "limit changes are refused from another origin (origin is not this host)",
            );
        }
    }
    Ok(())
}

/// Whether `origin` (`scheme://host[:port]`) names `host` (a `Host` value,
/// `host[:port]`): equal host and port, ASCII case ignored, a missing port
/// read as the scheme's default. `null` and anything with a path, user or
/// query is not a match.
fn origin_is_host(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    if authority.is_empty() || authority.contains(['/', '@', '?', '#']) {
        return false;
    }
    let with_port = |a: &str| -> String {
        // A port follows the last colon after an IPv6 literal's bracket.
        let after_bracket = a.rfind(']').map_or(0, |i| i + 1);
        if a[after_bracket..].contains(':') {
            a.to_ascii_lowercase()
        } else {
            format!("{}:{default_port}", a.to_ascii_lowercase())
        }
    };
    with_port(authority) == with_port(host)
}

#[cfg(test)]
mod tests {
    use super::origin_is_host;

    #[test]
    fn an_origin_matches_only_its_own_host_and_port() {
        for (origin, host) in [
            ("http://a.example", "a.example"),
            ("http://a.example", "a.example:80"),
            ("http://a.example:80", "a.example"),
            ("https://a.example", "a.example:443"),
            // `Host` carries no scheme: without a port it stands for the
            // origin scheme's default one.
            ("https://a.example", "a.example"),
            ("HTTP://A.Example:8080", "a.example:8080"),
            ("http://127.0.0.1:3000", "127.0.0.1:3000"),
            ("http://[::1]:3000", "[::1]:3000"),
            ("http://[::1]", "[::1]:80"),
        ] {
            assert!(origin_is_host(origin, host), "{origin} for {host}");
        }
        for (origin, host) in [
            ("http://evil.example", "a.example"),
            ("http://a.example:8081", "a.example:8080"),
            ("http://a.example", "a.example:443"),
            ("http://a.example:8080.evil.example", "a.example:8080"),
            ("http://a.example.evil.example", "a.example"),
            ("http://user@a.example", "a.example"),
            ("http://a.example/", "a.example"),
            ("null", "a.example"),
            ("file://", "a.example"),
            ("ftp://a.example", "a.example"),
            ("http://", ""),
            ("http://[::1]", "[::1]:3000"),
        ] {
            assert!(!origin_is_host(origin, host), "{origin} for {host}");
        }
    }
}
