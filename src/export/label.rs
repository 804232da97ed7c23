//! [`KeyLabel`]: how a key is shown as text in exports.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// A key that exporters can show as text: the `key` label of the Prometheus
/// collector, the key column of the dashboard.
///
/// Implemented for every built-in key type: `()` ([`GlobalKey`](crate::GlobalKey),
/// shown as `all`), `String` ([`PathKey`](crate::PathKey),
/// [`MethodPathKey`](crate::MethodPathKey), `MatchedPathKey`),
/// `Option<String>` ([`HeaderKey`](crate::HeaderKey)) and `Option<IpAddr>`
/// ([`PeerIpKey`](crate::PeerIpKey), [`ForwardedIpKey`](crate::ForwardedIpKey)),
/// and for the usual types of closure keys (strings, integers, addresses,
/// `Option`s of them). `Display` alone would not do: the built-in `Option`
/// keys have none, and their `None` (a request without the header or the
/// address) must stay apart from every `Some` value, the empty string
/// included.
///
/// ```
/// use std::net::IpAddr;
/// use tower_sliding_window::export::KeyLabel;
///
/// assert_eq!("/users".to_owned().label().as_deref(), Some("/users"));
/// let ip: Option<IpAddr> = Some([127, 0, 0, 1].into());
/// assert_eq!(ip.label().as_deref(), Some("127.0.0.1"));
/// assert_eq!(None::<String>.label(), None);
/// ```
pub trait KeyLabel {
    /// The key as text, or `None` for a key that stands for "missing" (the
    /// `None` of an `Option` key). Exporters mark such a key apart (label
    /// `entry="missing"`, a marked row) instead of inventing a text for it.
    fn label(&self) -> Option<Cow<'_, str>>;
}

impl KeyLabel for () {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed("all"))
    }
}

impl KeyLabel for String {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl KeyLabel for &'static str {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl KeyLabel for Box<str> {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl KeyLabel for Arc<str> {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl KeyLabel for Cow<'static, str> {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl<T: KeyLabel> KeyLabel for Option<T> {
    fn label(&self) -> Option<Cow<'_, str>> {
        self.as_ref().and_then(T::label)
    }
}

/// Types shown with their `Display`.
macro_rules! display_label {
    ($($t:ty),*) => {$(
        impl KeyLabel for $t {
            fn label(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Owned(self.to_string()))
            }
        }
    )*};
}

display_label!(
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, bool, char, u8, u16, u32, u64, u128, usize, i8, i16,
    i32, i64, i128, isize
);
