//! The lease state machines against exact oracles, inside the crate: they test the sans-IO
//! books (`LeaseBook`, `RateBook`), which are not public.

mod book;
mod rate;
