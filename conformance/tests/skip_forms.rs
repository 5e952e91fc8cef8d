//! The macro's skip forms: an unset server variable and a `None` factory skip every case loudly,
//! without evaluating (or after evaluating) the factory expression.

use async_trait::async_trait;
use eve_conformance::{Opened, StoreFactory};
use eve_core::{JournalStore, StoreError};
use std::sync::Arc;

#[derive(Debug)]
struct NeverUsed;

#[async_trait]
impl StoreFactory for NeverUsed {
    async fn create(&self) -> Result<Opened, StoreError> {
        panic!("a skipped case must not create a store")
    }
    async fn open(&self, _location: &str) -> Result<Option<Arc<dyn JournalStore>>, StoreError> {
        panic!("a skipped case must not open a store")
    }
}

fn must_not_be_evaluated() -> NeverUsed {
    panic!("skip_unless must skip before evaluating the factory expression")
}

mod unset_variable {
    use super::*;
    eve_conformance::store_suite!(
        skip_unless = "EVE_CONFORMANCE_SELFTEST_NEVER_SET",
        must_not_be_evaluated()
    );
}

mod none_factory {
    use super::*;
    eve_conformance::store_suite!(None::<NeverUsed>);
}
