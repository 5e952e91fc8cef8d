//! Store-level cases, one module per family. Each case is `pub async fn(&dyn StoreFactory)`
//! and panics with a message naming the broken guarantee.

pub mod appends;
pub mod blocked;
pub mod clauses;
pub mod deliveries;
pub mod hooks;
pub mod isolation;
pub mod keys;
pub mod leases;
pub mod limits;
pub mod persistence;
pub mod reads;
pub mod resets;
pub mod retention;
pub mod search;
pub mod sequences;
pub mod sessions;
pub mod starts;
pub mod turns;
pub mod wakeups;
