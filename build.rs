//! Compiles the A2A protos (proto/: 1.0's `lf.a2a.v1` and 0.3's `a2a.v1`) into one
//! descriptor set the gRPC binding and the gRPC upstreams read their messages with. protox
//! is a compiler written in Rust: no protoc to download.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let protos = ["lf/a2a/v1/a2a.proto", "a2a/v1/a2a.proto"];
    let files = protox::compile(protos, ["proto"])
        .unwrap_or_else(|e| panic!("the protos in proto/ do not compile: {e}"));
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bytes = prost::Message::encode_to_vec(&files);
    std::fs::write(out.join("a2a.descriptor.bin"), bytes).expect("OUT_DIR is writable");
}
