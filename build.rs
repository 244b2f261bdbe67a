//! Compiles the A2A 1.0 proto (proto/) into a descriptor set the gRPC binding reads its
//! messages with. protox is a compiler written in Rust: no protoc to download.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["lf/a2a/v1/a2a.proto"], ["proto"])
        .unwrap_or_else(|e| panic!("proto/lf/a2a/v1/a2a.proto does not compile: {e}"));
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bytes = prost::Message::encode_to_vec(&files);
    std::fs::write(out.join("a2a_v1.descriptor.bin"), bytes).expect("OUT_DIR is writable");
}
