//! Unit tests of the local replica: a snapshot's answers to ranges, the rows kept at each
//! revision, changes seen since a revision, and a wait in vain telling the task its stream is
//! stale.

use super::*;

fn rows(keys: &[(&str, i64)]) -> Rows {
    keys.iter()
        .map(|(k, rev)| {
            let entry = Entry {
                value: k.as_bytes().into(),
                mod_revision: *rev,
            };
            (Arc::<[u8]>::from(k.as_bytes()), entry)
        })
        .collect()
}

fn spec(key: &str, end: Option<&str>, limit: i64, reverse: bool) -> Spec {
    Spec {
        key: key.as_bytes().to_vec(),
        end: end.map(|e| e.as_bytes().to_vec()),
        limit,
        reverse,
    }
}

fn keys(page: &Page) -> Vec<String> {
    let keys = page.rows.iter().map(|r| String::from_utf8_lossy(&r.key));
    keys.map(|k| k.into_owned()).collect()
}

#[test]
fn a_snapshot_answers_ranges_as_etcd_does() {
    let snap = Snapshot(rows(&[("a", 1), ("b", 2), ("c", 3), ("d", 4)]));
    let one = snap.read(&spec("b", None, 1, false));
    assert_eq!(
        (keys(&one), one.rows[0].mod_revision, one.more),
        (vec!["b".into()], 2, false)
    );
    assert!(snap.read(&spec("z", None, 1, false)).rows.is_empty());
    let page = snap.read(&spec("a", Some("d"), 2, false));
    assert_eq!(
        (keys(&page), page.more),
        (vec!["a".into(), "b".into()], true)
    );
    let all = snap.read(&spec("b", Some("z"), 0, false));
    assert_eq!(
        (keys(&all), all.more),
        (vec!["b".into(), "c".into(), "d".into()], false)
    );
    let back = snap.read(&spec("a", Some("d"), 2, true));
    assert_eq!(
        (keys(&back), back.more),
        (vec!["c".into(), "b".into()], true)
    );
    assert!(snap.read(&spec("d", Some("a"), 0, false)).rows.is_empty());
}

#[test]
fn the_map_at_a_revision_is_the_newest_at_or_before_it() {
    let mut state = State {
        revision: 0,
        maps: VecDeque::new(),
        live: true,
        watchers: KeyWatchers::default(),
    };
    assert!(state.at(5).is_none(), "nothing loaded");
    state.push(10, rows(&[("a", 10)]));
    state.push(12, rows(&[("a", 10), ("b", 12)]));
    assert_eq!(state.at(11).map(|m| m.len()), Some(1));
    assert_eq!(state.at(12).map(|m| m.len()), Some(2));
    // Past the replica (the caller checked nothing changed since): the newest map.
    assert_eq!(state.at(40).map(|m| m.len()), Some(2));
    assert!(state.at(9).is_none(), "older than anything kept");
    for r in 13..(13 + KEPT as i64) {
        state.push(r, Rows::new());
    }
    assert!(state.at(12).is_none(), "dropped past the kept maps");
}

#[test]
fn a_key_changed_since_a_revision_is_seen_in_the_maps_kept() {
    let mut state = State {
        revision: 0,
        maps: VecDeque::new(),
        live: true,
        watchers: KeyWatchers::default(),
    };
    state.push(10, rows(&[("a", 10), ("b", 10)]));
    state.push(11, rows(&[("a", 11), ("b", 10)]));
    // Created and deleted again after 11: absent before and after, changed between.
    state.push(12, rows(&[("a", 11), ("b", 10), ("c", 12)]));
    state.push(13, rows(&[("a", 11), ("b", 10)]));
    let changed = |key: &str, start| state.changed_since(key.as_bytes(), start);
    assert_eq!(changed("a", 11), Some(true));
    assert_eq!(changed("a", 12), Some(false));
    assert_eq!(changed("b", 11), Some(false));
    assert_eq!(
        changed("c", 12),
        Some(true),
        "a create then delete is a change"
    );
    assert_eq!(
        changed("c", 14),
        Some(false),
        "nothing applied from there yet"
    );
    assert_eq!(changed("a", 10), None, "the map before 10 is not kept");
}

#[tokio::test(start_paused = true)]
async fn a_wait_in_vain_tells_the_task_its_stream_is_stale() {
    let replica = Replica::new();
    {
        let mut state = replica.state();
        state.live = true;
        state.push(5, rows(&[("a", 5)]));
    }
    let told = || tokio::time::timeout(Duration::from_millis(1), replica.stale.notified());
    assert!(replica.pin(5, 5).await.is_some());
    assert!(told().await.is_err(), "caught up: nothing to tell");
    assert!(
        replica.pin(10, 10).await.is_none(),
        "revision 10 never came"
    );
    assert!(told().await.is_ok(), "the task is told to arm a new stream");
}
