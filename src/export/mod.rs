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
