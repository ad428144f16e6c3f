//! Open vSwitch: the bridges of the node, from OVSDB.

mod bridges;
mod client;
pub mod wire;

pub use bridges::{
    Bridge, BridgeCheck, BridgeWatch, Expectation, apply_updates, bridges_from, check_bridges,
    default_expectations, external_id_mismatches, mismatches,
};
pub use client::{Client, Decoder, Garbage, Incoming, OvsdbError};
