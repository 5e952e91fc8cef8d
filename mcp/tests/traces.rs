//! `_meta.traceparent` on `tools/call`: a well-formed W3C trace context is kept with the run
//! (its spans join the client's trace); a malformed one is ignored, the call still starts.

mod common;

use common::*;
use eve_core::{Event, JournalStoreExt, RunId};
use rmcp::model::RequestMetaObject;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_traceparent_is_kept_and_a_bad_one_ignored() {
    let f = http_fixture().await;
    let c = connect(&f, TestClient::tasks()).await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for (service, meta, kept) in [
        ("a", Some(json!(tp)), Some(tp)),
        ("b", Some(json!("not-a-traceparent")), None),
        ("c", Some(json!(42)), None),
        ("d", None, None),
    ] {
        let mut p = call("deploy_approval", json!({ "service": service }));
        if let Some(v) = meta {
            let mut m = RequestMetaObject::new();
            m.insert(eve_mcp::META_TRACEPARENT.into(), v);
            p.meta = Some(m);
        }
        let run = RunId::new(start_task(&c, p).await);
        let events = f.store.read_all(&run, 0).await.unwrap();
        let Event::RunStarted { traceparent, .. } = &events[0].event else {
            panic!("no RunStarted");
        };
        assert_eq!(traceparent.as_deref(), kept, "{service}");
    }
    c.cancel().await.unwrap();
}
