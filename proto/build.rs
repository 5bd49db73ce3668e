//! Compiles `proto/*.proto` with protox (pure Rust, no protoc) and prost-build.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/baton.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    prost_build::Config::new().bytes(["."]).compile_fds(fds)?;
    Ok(())
}
