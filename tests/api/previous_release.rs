//! The previous release's gateway binary, for the rolling-upgrade test (`upgrade.rs`): built
//! from this repository's history at the commit `tests/fixtures/previous-release.toml` names.
//! On its own (std only), so that `helpers` can start the build without the two modules
//! depending on each other.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Starts building the previous release beside the suite when the whole suite runs: the
/// build takes about a minute and the upgrade tests sort last, so built on demand the suite
/// ended waiting for it alone. Called whenever a test starts a gateway; the first call
/// starts the build. Not with a filter or `--ignored` (the upgrade tests may not run, and
/// the process could end mid-build) nor under nextest (a process per test: each would
/// start its own): there the upgrade tests build it when they run.
pub(crate) fn start_building() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        if std::env::var_os("NEXTEST").is_none() && runs_the_whole_suite() {
            std::thread::spawn(binary);
        }
    });
}

/// Whether this test process was given no filter: no test name, no `--skip`, `--exact` or
/// `--ignored` (libtest's own arguments with a value are passed over).
fn runs_the_whole_suite() -> bool {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--skip" | "--exact" | "--ignored" => return false,
            "--test-threads" | "--format" | "--color" | "--logfile" | "-Z" | "--shuffle-seed" => {
                args.next();
            }
            a if !a.starts_with('-') => return false,
            _ => {}
        }
    }
    true
}

/// The gateway binary of the previous release, built once from this repository's history
/// into `<target>/releases/<commit>/`, and kept once per machine (as the SDK venvs are): a
/// commit's `--locked` build is the same gateway whichever clone built it, so a fresh clone
/// on a machine that has run the suite before takes it at once rather than compiling it.
pub(crate) fn binary() -> PathBuf {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let pointer = repo_root().join("tests/fixtures/previous-release.toml");
    let release: toml::Table = std::fs::read_to_string(&pointer)
        .unwrap_or_else(|e| panic!("{}: {e}", pointer.display()))
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", pointer.display()));
    let commit = release["commit"].as_str().expect("the release's commit");
    let kept = machine_cache()
        .join("releases")
        .join(commit)
        .join("a2a-gateway");
    // Looked for under the lock: a caller that waited for the build finds it kept, rather
    // than copying it again.
    let _one_build = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    if kept.exists() {
        return kept;
    }
    // <target>/debug/deps/api-…: the test build's own target directory.
    let exe = std::env::current_exe().unwrap();
    let debug = exe.ancestors().nth(2).unwrap().to_path_buf();
    let root = debug.parent().unwrap().join("releases").join(commit);
    let binary = root.join("target/debug/a2a-gateway");
    if !binary.exists() {
        // Built aside and moved in whole: a test process of its own (nextest) building it
        // too finds it done or builds its own.
        let aside = root.with_extension(std::process::id().to_string());
        build_release(commit, &debug, &aside);
        if std::fs::rename(&aside, &root).is_err() {
            let _ = std::fs::remove_dir_all(&aside);
        }
    }
    keep(&binary, &kept);
    binary
}

/// Where tools the tests fetch or build are kept per machine (`buf.sh` uses it too).
fn machine_cache() -> PathBuf {
    let var = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("A2A_TOOLS_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("a2a-gateway")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/a2a-gateway")))
        .unwrap_or_else(|| std::env::temp_dir().join("a2a-gateway-cache"))
}

/// Copies `binary` to `kept`, whole or not at all (copied aside, then renamed): another
/// clone's suite may be reading the same place. A machine where it cannot be kept builds
/// it again next time; that is all.
fn keep(binary: &Path, kept: &Path) {
    let Some(dir) = kept.parent() else { return };
    let aside = dir.join(format!(".a2a-gateway.{}", std::process::id()));
    let copied = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::copy(binary, &aside))
        .and_then(|_| std::fs::rename(&aside, kept));
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&aside);
        eprintln!("previous release: not kept in {}: {e}", dir.display());
    }
}

/// Builds the gateway at `commit` in `root`, with the dependencies this test build
/// compiled (`debug`): with the same Cargo.lock, only the gateway itself is compiled.
fn build_release(commit: &str, debug: &Path, root: &Path) {
    let git = |args: &[&std::ffi::OsStr]| {
        let mut git = Command::new("git");
        git.arg("-C").arg(repo_root()).args(args);
        run(&mut git)
    };
    let mut known = Command::new("git");
    known.arg("-C").arg(repo_root());
    known.args(["cat-file", "-e", &format!("{commit}^{{commit}}")]);
    assert!(
        known.status().is_ok_and(|s| s.success()),
        "the previous release's commit {commit} is not in this clone's history (a shallow \
         clone: `git fetch --unshallow`)"
    );
    let _ = std::fs::remove_dir_all(root);
    let src = root.join("src");
    let seeded = root.join("target/debug");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&seeded).unwrap();
    let archive = root.join("src.tar");
    git(&[
        "archive".as_ref(),
        "--output".as_ref(),
        archive.as_os_str(),
        commit.as_ref(),
    ]);
    // -m: the files are newer than anything built, whatever the commit's date.
    run(Command::new("tar")
        .arg("-xmf")
        .arg(&archive)
        .arg("-C")
        .arg(&src));
    // Compiled dependencies are linked, not copied; cargo's records of them are copied
    // (cargo rewrites those in place) with their times (a build script's record newer than
    // what it built makes cargo compile all that depends on it again). The gateway's own
    // are left out: its source differs.
    run(Command::new("cp")
        .arg("-al")
        .args([debug.join("deps"), debug.join("build")])
        .arg(&seeded));
    run(Command::new("cp")
        .arg("-a")
        .arg(debug.join(".fingerprint"))
        .arg(&seeded));
    for dir in [".fingerprint", "build", "deps"] {
        for entry in std::fs::read_dir(seeded.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if name.starts_with("a2a-gateway-") || name.contains("a2a_gateway") {
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
    }
    // An example brings the dev-dependencies in, so that every dependency's features are
    // those of this test build's; at the lowest priority, as the suite runs meanwhile.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut nice = Command::new("nice");
    // Not what `cargo test` set for this process (LD_LIBRARY_PATH, OUT_DIR, CARGO_*):
    // build scripts that read them would run again, and all that depends on them compile.
    nice.env_clear().envs(std::env::vars_os().filter(|(k, _)| {
        let k = k.to_string_lossy();
        !(k.starts_with("CARGO") || k == "OUT_DIR" || k == "LD_LIBRARY_PATH")
    }));
    run(nice
        .args(["-n", "19"])
        .arg(cargo)
        .args(["build", "--locked", "--bin", "a2a-gateway"])
        .args(["--example", "bare_jsonrpc", "--manifest-path"])
        .arg(src.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", root.join("target"))
        // Built once: incremental state would be half a gigabyte kept for nothing.
        .env("CARGO_INCREMENTAL", "0"));
}

/// Runs `command`, failing the test with its output when it fails.
fn run(command: &mut Command) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
