//! include/flm.h agrees with the Rust side: cbindgen regenerates it from the crate's
//! source with tools/capi/cbindgen.toml and the result must equal the checked-in file.
//! `FLM_UPDATE_HEADER=1` rewrites the file instead (then review and commit it).

use std::path::Path;

#[test]
fn checked_in_header_matches_the_rust_declarations() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses the crate");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    let header = crate_dir.join("../../include/flm.h");
    if std::env::var_os("FLM_UPDATE_HEADER").is_some() {
        std::fs::write(&header, &generated).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(&header).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/flm.h is out of date with tools/capi/src; regenerate it with \
         FLM_UPDATE_HEADER=1 cargo test -p flm-capi --test header"
    );
}
