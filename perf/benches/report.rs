//! The table the interleaved benches (`layer_paired`, `layer_threads`,
//! `keyed_admission`) print after their rounds, and the time they hand
//! criterion for its iterations ([`in_rounds`], `admission_paired` too).

/// One contender's figures, round by round: its ns per request, and what
/// it cost beyond its baseline in the same round.
pub(crate) struct Row {
    pub(crate) id: &'static str,
    pub(crate) ns: Vec<f64>,
    pub(crate) beyond: Vec<f64>,
}

/// The rows of the contenders named `ids`, in order; `ns(i)` and
/// `beyond(i)` give contender `i`'s columns.
pub(crate) fn rows(
    ids: impl IntoIterator<Item = &'static str>,
    ns: impl Fn(usize) -> Vec<f64>,
    beyond: impl Fn(usize) -> Vec<f64>,
) -> Vec<Row> {
    ids.into_iter()
        .enumerate()
        .map(|(i, id)| Row {
            id,
            ns: ns(i),
            beyond: beyond(i),
        })
        .collect()
}

/// Prints, after a blank line, `heading`, the load average (where there is
/// one) and a row per contender: the median of its ns per request, and the
/// median and quartiles of what it cost beyond its baseline (the column
/// `beyond_column`). Contender names are padded to `width`.
pub(crate) fn print_rows(heading: &str, beyond_column: &str, width: usize, rows: &[Row]) {
    println!();
    println!("{heading}");
    if let Some(load) = load_average() {
        println!("load average (1, 5, 15 min): {load}");
    }
    println!(
        "{:<width$} {:>11} {:>13}  quartiles of beyond",
        "contender", "ns/request", beyond_column
    );
    for row in rows {
        let own = Quartiles::of(row.ns.clone());
        let beyond = Quartiles::of(row.beyond.clone());
        println!(
            "{:<width$} {:>11.1} {:>13.1}  [{:.1}, {:.1}]",
            row.id, own.median, beyond.median, beyond.lower, beyond.upper
        );
    }
}

/// Prints what `ours` cost beyond its baseline (`baseline` names it)
/// relative to `theirs`: the ratio of the medians, and the median of the
/// per-round ratios.
pub(crate) fn print_ratio(ours: &Row, theirs: &Row, baseline: &str) {
    let (of_medians, per_round) = ratios(&ours.beyond, &theirs.beyond);
    println!(
        "{} / {} beyond {baseline}: {of_medians:.2} (ratio of medians), {per_round:.2} \
         (median per-round ratio)",
        ours.id, theirs.id
    );
}

/// The ratio of the medians of `a` and `b`, and the median of their
/// per-round ratios.
pub(crate) fn ratios(a: &[f64], b: &[f64]) -> (f64, f64) {
    let per_round = a.iter().zip(b).map(|(a, b)| a / b).collect();
    (
        Quartiles::of(a.to_vec()).median / Quartiles::of(b.to_vec()).median,
        Quartiles::of(per_round).median,
    )
}

/// Every round's ns per request, per contender (in the bench's order), as
/// the interleaved benches note them.
pub(crate) struct RoundTable<const N: usize>(Vec<[f64; N]>);

impl<const N: usize> RoundTable<N> {
    pub(crate) fn new() -> Self {
        RoundTable(Vec::new())
    }

    /// Notes one round.
    pub(crate) fn push(&mut self, round: [f64; N]) {
        self.0.push(round);
    }

    /// Rounds noted.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Contender `i`'s ns per request, round by round.
    pub(crate) fn column(&self, i: usize) -> Vec<f64> {
        self.0.iter().map(|round| round[i]).collect()
    }

    /// Contender `i`'s ns per request less contender `baseline`'s in the
    /// same round, round by round.
    pub(crate) fn beyond(&self, i: usize, baseline: usize) -> Vec<f64> {
        self.0
            .iter()
            .map(|round| round[i] - round[baseline])
            .collect()
    }

    /// The rows of the contenders named `ids` (in the table's order), each
    /// taken beyond the contender `baseline(i)` gives.
    pub(crate) fn rows(
        &self,
        ids: impl IntoIterator<Item = &'static str>,
        baseline: impl Fn(usize) -> usize,
    ) -> Vec<Row> {
        rows(ids, |i| self.column(i), |i| self.beyond(i, baseline(i)))
    }
}

/// What criterion's `iter_custom` asks of an interleaved bench: the time
/// of `iters` requests of one contender, measured in whole rounds of
/// `per_round` requests of it. `run(rounds)` runs that many rounds and
/// returns the time spent in the contender's requests, which is scaled
/// from the `rounds * per_round` requests timed to `iters`.
pub(crate) fn in_rounds(
    iters: u64,
    per_round: u64,
    run: impl FnOnce(u64) -> std::time::Duration,
) -> std::time::Duration {
    let rounds = iters.div_ceil(per_round);
    run(rounds).mul_f64(iters as f64 / (rounds * per_round) as f64)
}

/// The median and the quartiles of some values.
pub(crate) struct Quartiles {
    pub(crate) lower: f64,
    pub(crate) median: f64,
    pub(crate) upper: f64,
}

impl Quartiles {
    pub(crate) fn of(mut values: Vec<f64>) -> Quartiles {
        assert!(!values.is_empty(), "quartiles of nothing");
        values.sort_by(f64::total_cmp);
        Quartiles {
            lower: quantile(&values, 0.25),
            median: quantile(&values, 0.5),
            upper: quantile(&values, 0.75),
        }
    }
}

/// The `q` quantile of sorted `values`, interpolated between neighbours.
fn quantile(values: &[f64], q: f64) -> f64 {
    let rank = q * (values.len() - 1) as f64;
    let below = rank.floor() as usize;
    let above = rank.ceil() as usize;
    values[below] + (values[above] - values[below]) * (rank - below as f64)
}

/// The first three fields of `/proc/loadavg`, where there is one.
pub(crate) fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let fields: Vec<&str> = text.split_whitespace().take(3).collect();
    (fields.len() == 3).then(|| fields.join(" "))
}
