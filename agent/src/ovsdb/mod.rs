//! Open vSwitch: the bridges of the node, from OVSDB.

mod bridges;
mod client;
pub mod wire;

pub use bridges::{Bridge, BridgeChange, BridgeCheck, BridgeWatch, check_bridges};
pub use client::{Client, OvsdbError};
