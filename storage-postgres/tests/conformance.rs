//! The store conformance suite against a real PostgreSQL server, each case in fresh random
//! schemas (dropped afterwards). Skipped, loudly, when `EVE_TEST_POSTGRES_URL` is unset.

mod common;

eve_conformance::store_suite!(
    skip_unless = "EVE_TEST_POSTGRES_URL",
    common::PgFactory::from_env()
);
