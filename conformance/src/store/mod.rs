//! Store-level cases, one module per family. Each case is `pub async fn(&dyn StoreFactory)`
//! and panics with a message naming the broken guarantee.

pub mod appends;
pub mod limits;
pub mod starts;
