//! Unit tests of the fair-share policy on controlled time: the tables step by step, then a
//! simulated scheduler converging to the configured shares.

use super::*;

/// The key of database `name` (also used by `share_plan`'s tests).
pub(crate) fn db(name: &str) -> ShareKey {
    ShareKey::Db(name.into())
}

/// Settings with these shares (also used by `share_plan`'s tests).
pub(crate) fn params(shares: &[(&str, u32)]) -> ShareParams {
    ShareParams {
        shares: shares.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        ..ShareParams::default()
    }
}

const MIN: Duration = Duration::from_secs(60);

#[test]
fn shares_default_and_clamp() {
    let p = params(&[("a", 0), ("b", 5000), ("c", 250)]);
    assert_eq!(p.shares(&db("a")), 1);
    assert_eq!(p.shares(&db("b")), 1000);
    assert_eq!(p.shares(&db("c")), 250);
    assert_eq!(p.shares(&db("other")), 100);
    assert_eq!(p.shares(&ShareKey::Transient), 100);
}

#[test]
fn a_cycle_charges_running_time_and_raises_running_priorities() {
    let t0 = Instant::now();
    let mut fs = FairShare::new(ShareParams::default());
    fs.started("j1", db("a"), t0);
    assert_eq!(fs.priority(&"j1"), 0, "nothing charged yet");
    fs.update(t0 + MIN);
    // One minute = 6e7 µs of usage; one job, 100 shares: 6e7 × 1 / 100² = 6000 (CouchDB's
    // own example).
    assert_eq!(fs.usage()[&db("a")], 60_000_000);
    assert_eq!(fs.priority(&"j1"), 6000);
    // A job that waits decays by 0.98 per cycle (lazily), its group's usage by 0.5.
    fs.stopped(&"j1", t0 + MIN);
    fs.update(t0 + 2 * MIN);
    assert_eq!(fs.priority(&"j1"), 5880);
    assert_eq!(fs.usage()[&db("a")], 30_000_000);
    fs.update(t0 + 3 * MIN);
    assert_eq!(fs.priority(&"j1"), 5762);
}

#[test]
fn a_job_stopped_mid_cycle_is_charged_its_part() {
    let t0 = Instant::now();
    let mut fs = FairShare::new(ShareParams::default());
    fs.started("j1", db("a"), t0);
    fs.stopped(&"j1", t0 + Duration::from_secs(15));
    fs.update(t0 + MIN);
    assert_eq!(fs.usage()[&db("a")], 15_000_000);
    assert_eq!(
        fs.priority(&"j1"),
        0,
        "not running at the cycle: not raised"
    );
}

#[test]
fn more_shares_lower_priority_more_siblings_higher() {
    let t0 = Instant::now();
    let mut fs = FairShare::new(params(&[("big", 200)]));
    fs.started("a1", db("small"), t0);
    fs.started("b1", db("big"), t0);
    fs.update(t0 + MIN);
    assert_eq!(fs.priority(&"a1"), 6000);
    assert_eq!(fs.priority(&"b1"), 1500, "twice the shares: a quarter");
    // A second job in `small` starts as if it had run one cycle: 6e7 × 2 jobs / 100².
    fs.started("a2", db("small"), t0 + MIN);
    assert_eq!(fs.priority(&"a2"), 12_000);
    fs.update(t0 + 2 * MIN);
    // Decayed, plus usage(small) = 3e7 + 2 × 6e7 = 1.5e8, × 2 jobs / 100² = 30000.
    assert_eq!(fs.priority(&"a2"), 11_760 + 30_000);
}

#[test]
fn removed_jobs_leave_their_group_and_decayed_ones_are_pruned() {
    let t0 = Instant::now();
    let mut fs = FairShare::new(ShareParams::default());
    fs.started("j1", db("a"), t0);
    fs.started("j2", db("a"), t0);
    fs.removed(&"j2");
    assert_eq!(fs.len(), 1);
    fs.update(t0 + MIN);
    fs.stopped(&"j1", t0 + MIN);
    // 6000 × 0.98^n < 1 after ~431 cycles; the prune runs every PRUNE_EVERY cycles.
    for i in 2..=512u32 {
        fs.update(t0 + MIN * i);
    }
    assert!(fs.is_empty(), "{} left", fs.len());
}

/// A scheduler of `slots` running jobs over `groups` (name, shares, jobs): every cycle it
/// stops the `churn` running jobs with the highest priority (the longest running first on
/// ties) and starts the waiting ones with the lowest (the longest waiting first). Returns the
/// running time per group over cycles `measure`.
fn simulate(
    groups: &[(&str, u32, usize)],
    slots: usize,
    churn: usize,
    cycles: u32,
    measure: std::ops::Range<u32>,
) -> (ShareParams, BTreeMap<ShareKey, Duration>) {
    let p = params(&groups.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>());
    let mut fs = FairShare::new(p.clone());
    let t0 = Instant::now();
    let jobs: Vec<(String, ShareKey)> = groups
        .iter()
        .flat_map(|(g, _, n)| (0..*n).map(move |i| (format!("{g}{i}"), db(g))))
        .collect();
    // (job index) -> since when running / waiting.
    let mut running: Vec<(usize, u32)> = Vec::new();
    let mut waiting: Vec<(usize, u32)> = (0..jobs.len()).map(|i| (i, 0)).collect();
    let mut ran: BTreeMap<ShareKey, Duration> = BTreeMap::new();
    for c in 0..cycles {
        let now = t0 + MIN * c;
        fs.update(now);
        if measure.contains(&c) {
            for (i, _) in &running {
                *ran.entry(jobs[*i].1.clone()).or_default() += MIN;
            }
        }
        if running.len() + churn > slots || waiting.is_empty() {
            running.sort_by_key(|(i, since)| (std::cmp::Reverse(fs.priority(&jobs[*i].0)), *since));
            let stop = churn.min(running.len());
            for (i, _) in running.drain(..stop) {
                fs.stopped(&jobs[i].0, now);
                waiting.push((i, c));
            }
        }
        waiting.sort_by_key(|(i, since)| (fs.priority(&jobs[*i].0), *since));
        let start = slots.saturating_sub(running.len()).min(waiting.len());
        for (i, _) in waiting.drain(..start) {
            fs.started(jobs[i].0.clone(), jobs[i].1.clone(), now);
            running.push((i, c));
        }
    }
    (p, ran)
}

#[test]
fn unequal_shares_converge_to_their_ratio() {
    // 100 vs 900 shares, 20 jobs each, 10 slots: 1 and 9 slots in the long run.
    let (p, ran) = simulate(&[("a", 100, 20), ("b", 900, 20)], 10, 5, 300, 50..300);
    let err = share_error(&p, &ran);
    assert!(err <= 0.05, "error {err:.3}: {ran:?}");
}

#[test]
fn equal_shares_split_evenly_whatever_the_number_of_jobs() {
    // Round robin would give 30:5; fair share gives each group half the slots.
    let (p, ran) = simulate(&[("many", 100, 30), ("few", 100, 5)], 6, 2, 300, 50..300);
    let err = share_error(&p, &ran);
    assert!(err <= 0.1, "error {err:.3}: {ran:?}");
}

#[test]
fn share_error_measures_the_distance_from_the_shares() {
    let p = params(&[("a", 100), ("b", 900)]);
    let ran = |a: u64, b: u64| {
        BTreeMap::from([
            (db("a"), Duration::from_secs(a)),
            (db("b"), Duration::from_secs(b)),
        ])
    };
    assert!(share_error(&p, &ran(10, 90)) < 1e-9);
    assert!((share_error(&p, &ran(50, 50)) - 0.4).abs() < 1e-9);
    for (ratio, factor, why) in [
        (4.0, 2.0, "four times its share, less the band"),
        (1.9, 1.0, "within the band"),
        (0.6, 1.0, "within the band"),
        (0.25, 0.5, "a quarter of its share, less the band"),
        (f64::NAN, 1.0, "no ratio"),
        (0.0, 0.25, "nothing: the least"),
        (200.0, 4.0, "the most"),
    ] {
        assert_eq!(delay_factor(ratio), factor, "{why}");
    }
    assert_eq!(
        stop_rank(delay_factor(3.9)),
        0,
        "over its share, not stopped first"
    );
    assert_eq!(stop_rank(delay_factor(4.0)), 1, "four times: stopped first");
}

#[test]
fn the_smoothed_ratio_moves_a_quarter_of_the_way_per_tick() {
    assert_eq!(
        smooth_ratio(f64::NAN, 3.0, RATIO_SMOOTHING),
        3.0,
        "no number before: the ratio itself"
    );
    assert_eq!(
        smooth_ratio(1.0, 1.8, RATIO_SMOOTHING),
        1.2,
        "one noisy tick stays in the band"
    );
    assert!(smooth_ratio(1.0, f64::NAN, RATIO_SMOOTHING).is_nan());
    // A real imbalance, measured at every tick, passes the band within a few ticks.
    let ticks_past_band = |ratio: f64| {
        let (mut r, mut ticks) = (1.0, 0);
        while delay_factor(r) == 1.0 && ticks < 100 {
            r = smooth_ratio(r, ratio, RATIO_SMOOTHING);
            ticks += 1;
        }
        ticks
    };
    for (ratio, ticks, why) in [
        (5.0, 2, "five times its share"),
        (3.0, 3, "three times its share"),
        (0.2, 4, "a fifth of its share"),
        (0.0, 3, "nothing"),
        (1.5, 100, "the swing of a clustered database: never"),
    ] {
        assert_eq!(ticks_past_band(ratio), ticks, "{why}");
    }
}

#[test]
fn a_rotations_swing_stays_in_the_band_when_averaged_over_the_rotation() {
    // A database whose jobs sit together in a 20-cycle rotation: far over its part for 8
    // ticks, nothing for 12, exactly its share over the rotation.
    let swing = |weight: f64| {
        let mut r = 1.0;
        let mut outside = 0;
        for tick in 0..200 {
            let measured = if tick % 20 < 8 { 2.5 } else { 0.0 };
            r = smooth_ratio(r, measured, weight);
            if delay_factor(r) != 1.0 {
                outside += 1;
            }
        }
        outside
    };
    assert!(
        swing(RATIO_SMOOTHING) > 50,
        "a quarter per tick follows the swing"
    );
    assert_eq!(ratio_weight(20.0), 0.05);
    assert_eq!(
        swing(ratio_weight(20.0)),
        0,
        "a rotation's average does not"
    );
    // Short rotations keep the quarter; a nonsense length falls back to it.
    assert_eq!(ratio_weight(2.0), RATIO_SMOOTHING);
    assert_eq!(ratio_weight(f64::NAN), RATIO_SMOOTHING);
    assert_eq!(ratio_weight(f64::INFINITY), RATIO_SMOOTHING);
}
