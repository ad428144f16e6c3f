//! Compiles `hv/v1/*.proto` with protox (pure Rust), so no `protoc` binary is
//! needed on a fresh machine. The encoded descriptor set is kept for gRPC
//! server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["hv/v1/agent.proto", "hv/v1/fleet.proto", "hv/v1/identity.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("hv_v1_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The generated `connect(dst)` constructor would clash with the
        // `Connect` rpc; clients are built with `new(channel)` instead.
        .build_transport(false)
        // Small per-stream buffers: a coordinator holds thousands of streams.
        .codec_path("crate::codec::LeanCodec")
        .compile_fds(fds)?;
    Ok(())
}
