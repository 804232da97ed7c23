//! Exporting the statistics: a Prometheus collector (feature `prometheus`)
//! and a live dashboard (feature `dashboard`).
//!
//! Both read the shared state through a [`StatsHandle`](crate::StatsHandle)
//! when they are asked (a scrape, a page refresh), never on a request's
//! path. Both show keys as text, through [`KeyLabel`].

mod label;

#[cfg(feature = "dashboard")]
#[cfg_attr(docsrs, doc(cfg(feature = "dashboard")))]
pub mod dashboard;
#[cfg(feature = "prometheus")]
mod prometheus;

pub use label::KeyLabel;
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub use prometheus::PrometheusCollector;

/// The `prometheus-client` crate the collector is built against (0.24):
/// [`PrometheusCollector`] implements this crate's `Collector` and
/// registers only in this crate's `Registry`. Use it through this path, or
/// depend on the same major version (`prometheus-client = "0.24"`): a
/// registry of another version does not accept the collector.
///
/// ```
/// use tower_sliding_window::export::prometheus_client::encoding::text::encode;
/// use tower_sliding_window::export::prometheus_client::registry::Registry;
/// use tower_sliding_window::SlidingWindowLayer;
///
/// let layer = SlidingWindowLayer::qps(100);
/// let mut registry = Registry::default();
/// registry.register_collector(Box::new(layer.handle().collector()));
/// let mut text = String::new();
/// encode(&mut text, &registry).unwrap();
/// ```
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub mod prometheus_client {
    // Every public module of the crate, one by one rather than the crate
    // itself, so that the public-API check names each.
    pub use ::prometheus_client::{collector, encoding, metrics, registry};
}
