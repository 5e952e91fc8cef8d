//! Run attributes and run search: `AttributesSet` events update a run's
//! [`attributes`](eve_core::RunRecord::attributes) and the store's `(key, value)` index
//! ([`RunQuery::attribute`]); [`search_runs`] evaluates a [`RunSearch`] on attributes and input
//! the same way over every backend.

use crate::fixtures::*;
use crate::{assert_err, StoreFactory};
use eve_core::{
    search_runs, Event, JournalStore, NewRun, RunId, RunQuery, RunSearch, SessionId, StoreError,
};
use serde_json::{json as j, Value};

fn set(cmd: u64, patch: Value) -> Event {
    Event::AttributesSet {
        cmd,
        attributes: json(&patch.to_string()),
    }
}

async fn find(st: &dyn JournalStore, session: &SessionId, q: &str) -> Vec<RunId> {
    let search = RunSearch::parse(q).unwrap_or_else(|e| panic!("{q}: {e}"));
    search_runs(
        st,
        &RunQuery {
            session: Some(session.clone()),
            ..RunQuery::default()
        },
        Some(&search),
    )
    .await
    .unwrap_or_else(|e| panic!("search {q:?} failed: {e}"))
    .into_iter()
    .map(|r| r.run_id)
    .collect()
}

async fn indexed(st: &dyn JournalStore, key: &str, value: Value) -> Vec<RunId> {
    st.list_runs(&RunQuery {
        attribute: Some((key.to_owned(), value.clone())),
        ..RunQuery::default()
    })
    .await
    .unwrap_or_else(|e| panic!("list_runs by attribute {key} = {value} failed: {e}"))
    .into_iter()
    .map(|r| r.run_id)
    .collect()
}

/// Three runs of one session label themselves through appended `AttributesSet` events. Their
/// records carry the merged attributes (numbers canonical: `10.0` is `10`); `list_runs` with an
/// attribute equality (the index) finds exactly the runs holding that value; searches match by
/// equality and ranges on attributes and on input fields, a type mismatch matching nothing; a
/// limit counts matching runs only (only the last of three runs matches: a limit of 1 finds it).
/// Overwriting a key and removing one (`null`), also twice in one append (the last change
/// wins), changes what matches; a patch with a nested value is refused with `InvalidInput` and
/// writes nothing; a query that does not parse is `InvalidInput`. A purge of the ended runs
/// leaves nothing for the index to find.
pub async fn attributes_are_indexed_and_searchable(factory: &dyn StoreFactory) {
    let s = fresh(factory).await;
    let st = &*s.store;
    let session = SessionId::new(unique("search-session"));
    let region = unique("eu");
    let moved = format!("us-{region}");
    let mk = |tag: &str, input: &str| NewRun {
        session_id: session.clone(),
        input: json(input),
        ..new_run(tag)
    };
    let (a, la) = started(st, mk("search-a", r#"{"service": "api", "n": 5}"#), at(0)).await;
    let (b, lb) = started(st, mk("search-b", r#"{"service": "web", "n": 50}"#), at(1)).await;
    let (c, lc) = started(
        st,
        mk(
            "search-c",
            r#"{"service": "api", "n": 500, "deep": {"k": "v"}}"#,
        ),
        at(2),
    )
    .await;
    let (a, b, c) = (a.run_id, b.run_id, c.run_id);
    must_append(
        st,
        append(
            &a,
            1,
            &la,
            vec![set(1, j!({"region": region, "cost": 10.0, "vip": true}))],
            at(3),
        ),
    )
    .await;
    must_append(
        st,
        append(
            &b,
            1,
            &lb,
            vec![set(1, j!({"region": region, "cost": 20.5}))],
            at(3),
        ),
    )
    .await;
    must_append(
        st,
        append(
            &c,
            1,
            &lc,
            vec![set(1, j!({"region": moved, "cost": 30}))],
            at(3),
        ),
    )
    .await;

    assert_eq!(
        serde_json::to_value(&record(st, &a).await.attributes).expect("attributes serialize"),
        j!({"region": region, "cost": 10, "vip": true}),
        "the record carries the merged attributes, numbers in canonical form"
    );
    assert_eq!(
        indexed(st, "region", j!(region)).await,
        vec![a.clone(), b.clone()],
        "list_runs by attribute (the index) finds exactly the runs holding the value"
    );
    assert_eq!(
        indexed(st, "cost", j!(10.0)).await,
        vec![a.clone()],
        "10.0 is 10"
    );
    for (limit, want) in [(1, vec![c.clone()]), (2, vec![c.clone()])] {
        let got: Vec<RunId> = st
            .list_runs(&RunQuery {
                attribute: Some(("region".into(), j!(moved))),
                limit,
                ..RunQuery::default()
            })
            .await
            .unwrap_or_else(|e| panic!("list_runs by attribute with limit {limit}: {e}"))
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(
            got, want,
            "the limit counts the runs that hold the attribute, not the runs before the filter"
        );
    }
    let cases: Vec<(String, Vec<&RunId>)> = vec![
        (format!("attr.region = \"{region}\""), vec![&a, &b]),
        ("attr.cost >= 20".into(), vec![&b, &c]),
        (
            format!("attr.cost < 20.5 and attr.region = \"{region}\""),
            vec![&a],
        ),
        ("attr.cost <= 20.5".into(), vec![&a, &b]),
        ("attr.vip = true".into(), vec![&a]),
        ("attr.vip != true".into(), vec![]),
        (format!("attr.region > \"{region}\""), vec![&c]),
        (format!("attr.region != \"{region}\""), vec![&c]),
        ("attr.cost = \"10\"".into(), vec![]),
        ("attr.missing = 1".into(), vec![]),
        ("input.service = \"api\"".into(), vec![&a, &c]),
        ("input.n > 10 and input.service = \"api\"".into(), vec![&c]),
        ("input.n >= 5 and input.n < 500".into(), vec![&a, &b]),
        ("input.deep.k = \"v\"".into(), vec![&c]),
        ("input.service = 1".into(), vec![]),
        (
            format!("input.service = \"api\" and attr.region = \"{region}\" and attr.cost >= 10"),
            vec![&a],
        ),
    ];
    for (q, want) in &cases {
        let want: Vec<RunId> = want.iter().map(|r| (*r).clone()).collect();
        assert_eq!(find(st, &session, q).await, want, "search {q:?}");
    }

    // Overwrite and remove; two changes of one key in one append: the last wins.
    must_append(
        st,
        append(
            &a,
            2,
            &la,
            vec![
                set(2, j!({"region": moved, "cost": null})),
                set(3, j!({"tmp": 1})),
                set(4, j!({"tmp": null, "tier": "gold"})),
            ],
            at(4),
        ),
    )
    .await;
    assert_eq!(
        serde_json::to_value(&record(st, &a).await.attributes).expect("attributes serialize"),
        j!({"region": moved, "vip": true, "tier": "gold"}),
        "set keys overwrite, null removes, keys not named stay"
    );
    assert_eq!(indexed(st, "region", j!(region)).await, vec![b.clone()]);
    assert_eq!(
        indexed(st, "region", j!(moved)).await,
        vec![a.clone(), c.clone()]
    );
    assert_eq!(indexed(st, "tmp", j!(1)).await, Vec::<RunId>::new());
    assert_eq!(indexed(st, "cost", j!(10)).await, Vec::<RunId>::new());
    assert_eq!(
        find(st, &session, "attr.cost >= 0").await,
        vec![b.clone(), c.clone()]
    );
    assert_eq!(
        find(st, &session, "attr.tier = \"gold\"").await,
        vec![a.clone()]
    );

    // A nested value is refused, and nothing is written.
    assert_err!(
        st.append(append(
            &b,
            2,
            &lb,
            vec![set(2, j!({"nested": {"x": 1}}))],
            at(5)
        ))
        .await,
        StoreError::InvalidInput(_),
        "an AttributesSet with a nested value"
    );
    assert_eq!(
        record(st, &b).await.next_seq,
        2,
        "a refused patch writes nothing"
    );
    assert_err!(
        RunSearch::parse("attr.region == or"),
        StoreError::InvalidInput(_),
        "a query that does not parse"
    );

    // Purge the ended runs: the index finds nothing of them.
    for (run, lease, seq) in [(&a, &la, 5), (&b, &lb, 2), (&c, &lc, 2)] {
        must_append(st, append(run, seq, lease, vec![completed("null")], at(6))).await;
    }
    st.purge(at(7), 0)
        .await
        .unwrap_or_else(|e| panic!("purge failed: {e}"));
    assert_eq!(indexed(st, "region", j!(moved)).await, Vec::<RunId>::new());
    assert_eq!(indexed(st, "region", j!(region)).await, Vec::<RunId>::new());
    assert_eq!(indexed(st, "tier", j!("gold")).await, Vec::<RunId>::new());
    assert_eq!(
        find(st, &session, "input.service = \"api\"").await,
        Vec::<RunId>::new()
    );
}
