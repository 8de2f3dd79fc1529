//! Generated code for the `easd.v1` wire contract (`proto/easd/v1/easd.proto`).
//!
//! Generated types stay at the service edge: libraries convert them to their own types.

/// The `easd.v1` package: messages, clients and servers.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("easd.v1");
}

pub mod codec;

/// Encoded `FileDescriptorSet` of the contract, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/easd_descriptor.bin"));
