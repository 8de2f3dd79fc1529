//! Generates the easd.v1 gRPC code with protox (a pure-Rust protobuf compiler), so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    let file = format!("{proto_root}/easd/v1/easd.proto");
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([&file], [proto_root])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("easd_descriptor.bin"), prost::Message::encode_to_vec(&descriptors))?;
    // Undecodable requests are INVALID_ARGUMENT, not tonic-prost's INTERNAL (src/codec.rs).
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .codec_path("crate::codec::EasdCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
