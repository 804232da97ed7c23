//! The criterion group `layer`: each contender measured on its own, one
//! after another.
//!
//! Good for absolute figures and for tracking one contender over time.
//! Differences between contenders under about 150 ns are within the drift
//! between two runs on a shared machine; `layer_paired` resolves those.

use std::time::Instant;

use criterion::{Criterion, Throughput};

use super::{runtime, serve_one, Contender};

pub(crate) fn bench(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("layer");
    group.throughput(Throughput::Elements(1));
    for contender in Contender::ALL {
        let mut app = contender.app(&runtime);
        group.bench_function(contender.id(), |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        serve_one(contender, &mut app).await;
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}
