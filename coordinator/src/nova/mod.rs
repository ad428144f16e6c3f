//! Nova and Placement, as the lifecycle needs them (DESIGN.md section 3):
//! Keystone authentication and the catalog through `openstack_sdk`
//! ([`http`]), the host operations over it ([`host`]), and typed errors
//! ([`error`]).

pub mod capacity;
pub mod error;
pub mod host;
pub mod http;
pub mod servers;

pub use error::NovaError;
pub use host::NovaClient;
pub use http::{Cloud, CloudSource, HttpPolicy};
