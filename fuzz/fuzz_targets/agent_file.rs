//! The configuration loader: any agent file (and any gateway.toml) loads or is refused
//! with diagnostics that point inside the file, without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (agent, gateway) = text.split_once("\n---\n").unwrap_or((text, ""));
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let agents = dir.path().join("agents.d");
    std::fs::create_dir(&agents).unwrap();
    std::fs::write(agents.join("a.toml"), agent).unwrap();
    let gateway_toml = dir.path().join("gateway.toml");
    std::fs::write(&gateway_toml, gateway).unwrap();
    if let Err(diags) = a2a_gateway::setup::load(Some(&gateway_toml), &agents) {
        for d in &diags.0 {
            let lines = if d.file.ends_with("a.toml") {
                agent
            } else {
                gateway
            }
            .lines()
            .count();
            assert!(
                d.line <= lines.max(1) + 1,
                "{d} points past the end of the file"
            );
            let _ = d.to_string();
        }
    }
});
