//! The hv wire protocol, generated from `proto/hv/v1/*.proto`.
//!
//! `hv::v1` holds the messages and the tonic clients and servers for
//! `AgentService` (agent <-> coordinator), `FleetService` (SRE read API)
//! and `IdentityService` (an agent's certificate).

#![forbid(unsafe_code)]

pub mod codec;

pub mod hv {
    pub mod v1 {
        #![allow(clippy::all, clippy::pedantic)]
        tonic::include_proto!("hv.v1");
    }
}

pub use hv::v1;

/// Encoded `FileDescriptorSet` of the hv.v1 package, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hv_v1_descriptor");
