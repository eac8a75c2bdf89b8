//! Compiles colibri.v1 with protox (a pure-Rust protobuf compiler), so building needs no
//! system `protoc`, and writes the encoded descriptor set for server reflection.

use prost::Message;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "colibri/v1/colibri.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("colibri_v1_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Keeps GenerateEvent's Finished variant (one per stream) from making every Tokens
        // event as large as the expert cache's statistics.
        .boxed(".colibri.v1.GenerationStats.expert_cache")
        .compile_fds(fds)?;
    Ok(())
}
