//! agents.d and gateway.toml validation: every problem is reported with file and line.

use a2a_gateway::config;

use crate::helpers::{repo_root, write_config, ECHO};

/// Loads the given files and returns the rendered diagnostics (empty when valid).
fn problems(files: &[(&str, &str)], gateway: Option<&str>) -> Vec<String> {
    // Always name a gateway file, so the repository's own gateway.toml (in the test's
    // working directory) never leaks in.
    let (_dir, agents, gateway) = write_config(files, Some(gateway.unwrap_or("")));
    match a2a_gateway::setup::load(gateway.as_deref(), &agents) {
        Ok(_) => Vec::new(),
        Err(d) => {
            d.0.iter()
                .map(|d| {
                    let file = d.file.file_name().unwrap().to_string_lossy().to_string();
                    format!("{file}:{}:{}: {}", d.line, d.col, d.message)
                })
                .collect()
        }
    }
}

#[test]
fn each_invalid_definition_points_at_file_and_line() {
    let cases: &[(&str, &str, &str)] = &[
        ("unknown key", "name = \"a\"\ndescription = \"d\"\ncolour = \"red\"\n[backend]\nkind = \"echo\"\n",
         "a.toml:3:1: unknown field `colour`"),
        ("bad name", "name = \"Bad Name\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\n",
         "a.toml:1:8: name \"Bad Name\" must start with a lowercase letter or a digit"),
        ("slash in name", "name = \"a/b\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\n",
         "a.toml:1:8: name \"a/b\" contains '/'"),
        ("missing description", "name = \"a\"\n[backend]\nkind = \"echo\"\n",
         "a.toml:1:1: missing field `description`"),
        ("empty description", "name = \"a\"\ndescription = \"  \"\n[backend]\nkind = \"echo\"\n",
         "a.toml:2:15: description must not be empty"),
        ("wrong type", "name = \"a\"\ndescription = \"d\"\nversion = 3\n[backend]\nkind = \"echo\"\n",
         "a.toml:3:11: invalid type: integer `3`, expected a string"),
        ("unknown backend", "name = \"a\"\ndescription = \"d\"\n[backend]\nkind = \"teleport\"\n",
         "a.toml:4:8: unknown variant `teleport`, expected one of `echo`, `a2a`, `command`"),
        ("missing backend", "name = \"a\"\ndescription = \"d\"\n",
         "a.toml:1:1: missing field `backend`"),
        ("unknown backend key", "name = \"a\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\nspeed = 1\n",
         "a.toml:3:1: unknown field `speed`"),
        ("duplicate skill", "name = \"a\"\ndescription = \"d\"\n[[skills]]\nid = \"s\"\nname = \"S\"\ndescription = \"x\"\n[[skills]]\nid = \"s\"\nname = \"S2\"\ndescription = \"y\"\n[backend]\nkind = \"echo\"\n",
         "a.toml:7:1: duplicate skill id \"s\""),
        ("zero limit", "name = \"a\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\n[limits]\nmailbox = 0\n",
         "a.toml:6:11: limits must be at least 1"),
        ("not TOML", "name = \n", "a.toml:1:8: "),
    ];
    for (label, text, want) in cases {
        let got = problems(&[("a.toml", text)], None);
        assert!(
            got.iter().any(|g| g.starts_with(want)),
            "{label}: wanted {want:?}, got {got:?}"
        );
    }
}

#[test]
fn every_problem_of_every_file_is_reported_in_one_pass() {
    let got = problems(
        &[
            (
                "a.toml",
                "name = \"dup\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\n",
            ),
            (
                "b.toml",
                "name = \"dup\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\n",
            ),
            (
                "c.toml",
                "name = \"C\"\ndescription = \"\"\n[backend]\nkind = \"echo\"\n",
            ),
            ("notes.txt", "ignored: not a .toml file"),
        ],
        Some("default_agent = \"missing\"\n"),
    );
    assert!(
        got.iter()
            .any(|g| g.starts_with("b.toml:1:8: duplicate agent name \"dup\" (already defined in")),
        "{got:?}"
    );
    assert!(
        got.iter().any(|g| g.starts_with("c.toml:1:8: name \"C\"")),
        "{got:?}"
    );
    assert!(
        got.iter()
            .any(|g| g.starts_with("c.toml:2:15: description must not be empty")),
        "{got:?}"
    );
    assert!(
        got.iter()
            .any(|g| g.starts_with("gateway.toml:1:17: default_agent \"missing\" is not defined")),
        "{got:?}"
    );
    assert_eq!(got.len(), 4, "{got:?}");
}

#[test]
fn gateway_toml_is_strict_too() {
    let got = problems(
        &[("echo.toml", ECHO)],
        Some("name = \"gw\"\n[limits]\nmax_body = 5\n"),
    );
    assert!(
        got.iter()
            .any(|g| g.starts_with("gateway.toml:3:1: unknown field `max_body`")),
        "{got:?}"
    );
    let got = problems(
        &[("echo.toml", ECHO)],
        Some("public_url = \"agents.example.com\"\n"),
    );
    assert!(
        got.iter()
            .any(|g| g.contains("public_url must be an absolute http(s) URL")),
        "{got:?}"
    );
}

/// A `[limits]` count or duration of 0 is refused at load, naming the key, not raised to
/// 1 or used as is (a body budget of 0 would refuse every slow body).
#[test]
fn limits_of_zero_are_refused_by_name() {
    for key in [
        "max_body_bytes",
        "max_tasks",
        "agent_mailbox",
        "agent_max_concurrency",
        "stream_keepalive_secs",
        "max_open_streams",
        "max_connections",
        "max_connections_per_ip",
        "header_timeout_secs",
        "body_timeout_secs",
        "body_min_bytes_per_sec",
        "max_buffered_body_bytes",
        "max_buffered_body_bytes_per_caller",
        "max_unfinished_tasks_per_caller",
        "max_stored_bytes",
        "max_unfinished_bytes_per_caller",
        "interrupted_ttl_secs",
    ] {
        let got = problems(
            &[("echo.toml", ECHO)],
            Some(&format!("[limits]\n{key} = 0\n")),
        );
        let want = format!("limits.{key} must be at least 1");
        assert!(
            got.len() == 1 && got[0].contains(&want),
            "{key}: wanted only {want:?}, got {got:?}"
        );
    }
    // A card that is not to be cached is a choice, not a mistake.
    let got = problems(
        &[("echo.toml", ECHO)],
        Some("[limits]\ncard_max_age_secs = 0\n"),
    );
    assert!(got.is_empty(), "{got:?}");
}

#[test]
fn an_empty_agents_dir_is_an_error() {
    let got = problems(&[], None);
    assert!(
        got.iter()
            .any(|g| g.contains("no agent definitions (*.toml files) found")),
        "{got:?}"
    );
}

#[test]
fn a_single_agent_becomes_the_default() {
    let (_dir, agents, gateway) = write_config(&[("echo.toml", ECHO)], Some(""));
    let settings = config::load(gateway.as_deref(), &agents).unwrap();
    assert_eq!(settings.gateway.default_agent_name(), Some("echo"));
}

#[test]
fn every_shipped_file_loads() {
    let root = repo_root();
    let settings = config::load(Some(&root.join("gateway.toml")), &root.join("agents.d"))
        .unwrap_or_else(|d| panic!("shipped configuration is invalid:\n{d}"));
    let shipped = std::fs::read_dir(root.join("agents.d"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "toml")
        })
        .count();
    assert_eq!(
        settings.agents.len(),
        shipped,
        "every agents.d/*.toml became an agent"
    );
    assert!(settings.agents.iter().any(|a| a.name == "echo"));
    assert_eq!(settings.gateway.default_agent_name(), Some("echo"));
}

/// One run reports everything: a file with an unknown key still has its bad name, its
/// empty description and its missing program reported, and names are checked for
/// duplicates across files even when one of them has other problems.
#[test]
fn a_file_with_a_wrong_key_still_reports_its_other_problems() {
    let got = problems(
        &[
            (
                "a.toml",
                "name = \"Bad\"\ndescription = \"\"\ncolour = \"red\"\n[backend]\nkind = \"command\"\ncommand = [\"./missing.sh\"]\n",
            ),
            (
                "b.toml",
                "name = \"twin\"\ndescription = \"d\"\nsize = 3\n[backend]\nkind = \"echo\"\n",
            ),
            ("c.toml", "name = \"twin\"\ndescription = \"d\"\n[backend]\nkind = \"echo\"\n"),
        ],
        None,
    );
    for want in [
        "a.toml:3:1: unknown field `colour`",
        "a.toml:1:8: name \"Bad\" must start with a lowercase letter",
        "a.toml:2:15: description must not be empty",
        "backend.command: program \"./missing.sh\" not found",
        "b.toml:3:1: unknown field `size`",
        "c.toml:1:8: duplicate agent name \"twin\"",
    ] {
        assert!(
            got.iter().any(|g| g.contains(want)),
            "wanted {want:?} in {got:#?}"
        );
    }
    assert_eq!(
        got.iter()
            .filter(|g| g.contains("unknown field `colour`"))
            .count(),
        1,
        "each problem once: {got:#?}"
    );
}

/// The JSON schemas of both files are the ones the binary generates from its own types,
/// and the shipped files validate against them (editors use them to complete and check).
#[test]
fn the_shipped_schemas_are_current_and_the_shipped_files_follow_them() {
    use a2a_gateway::config::{schema, SchemaOf};
    let root = repo_root();
    for (of, file) in [
        (SchemaOf::Gateway, "gateway.schema.json"),
        (SchemaOf::Agent, "agent.schema.json"),
    ] {
        let path = root.join("docs/schema").join(file);
        let committed: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            committed,
            schema(of),
            "{} is out of date: cargo run -- schema {} > docs/schema/{file}",
            path.display(),
            if of == SchemaOf::Gateway {
                "gateway"
            } else {
                "agent"
            },
        );
    }
    let validator = |of| jsonschema::validator_for(&schema(of)).unwrap();
    let as_json = |path: &std::path::Path| -> serde_json::Value {
        toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let gateway = validator(SchemaOf::Gateway);
    let errors: Vec<String> = gateway
        .iter_errors(&as_json(&root.join("gateway.toml")))
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "gateway.toml: {errors:?}");
    let agent = validator(SchemaOf::Agent);
    let mut files = 0;
    for entry in std::fs::read_dir(root.join("agents.d")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !(name.ends_with(".toml") || name.ends_with(".toml.example")) {
            continue;
        }
        files += 1;
        let errors: Vec<String> = agent
            .iter_errors(&as_json(&path))
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");
    }
    assert!(files >= 4, "read the shipped agents");
    // And the schema does refuse what the loader refuses.
    let bad = serde_json::json!({"name": "a", "colour": "red", "backend": {"kind": "echo"}});
    assert!(!agent.is_valid(&bad));
    let bad = serde_json::json!({"name": "a", "backend": {"kind": "telepathy"}});
    assert!(!agent.is_valid(&bad));
}

#[test]
fn a_policy_that_does_not_compile_points_at_the_spot_in_its_expression() {
    let gateway = r#"[[auth.policies]]
id = "typo"
effect = "deny"
when = "a2a.method == 'CancelTask' && caller.nmae == 'x'"

[[auth.policies]]
id = "multi"
effect = "deny"
when = """
a2a.method == 'GetTask' &&
  request.header('Authorization') != ''"""

[[auth.policies]]
id = "typo"
effect = "allow"
agents = ["ghost"]
when = "a2a.method =="

[[auth.policies]]
id = "bad id!"
effect = "deny"
when = "true"

[rate_limits.tiers.default]
requests_per_minute = 60
burst = 4
weights = { SendMesage = 2, GetTask = 9 }
"#;
    let agent = format!(
        "{ECHO}\n[[policies]]\nid = \"p\"\neffect = \"deny\"\nagents = [\"echo\"]\nwhen = \"agent.colour == 'red'\"\n"
    );
    let got = problems(&[("echo.toml", &agent)], Some(gateway));
    let want = [
        // The field's position inside the string: column 8 is the expression's first.
        "gateway.toml:4:39: policy \"typo\": caller has no field \"nmae\"",
        // A multi-line string: the line of the expression, past the newline TOML drops.
        "gateway.toml:11:3: policy \"multi\": request.header('authorization'): a policy may not read credentials",
        "gateway.toml:17:8: auth.policies: policy \"typo\" is defined twice",
        "gateway.toml:17:8: auth.policies: policy \"typo\": agent \"ghost\" is not defined",
        "gateway.toml:22:8: auth.policies: policy id \"bad id!\" must be",
        "echo.toml:16:8: policy \"p\": an agent file's policies apply to its agent",
        "gateway.toml:0:0: rate_limits: tiers.default.weights: \"SendMesage\" is not an A2A 1.0 method name",
        "gateway.toml:0:0: rate_limits: tiers.default.weights.GetTask: 9 must be from 1 to the burst (4)",
    ];
    for want in want {
        assert!(
            got.iter().any(|g| g.starts_with(want)),
            "wanted {want:?} in {got:?}"
        );
    }
    // Once the file's own problems are fixed, the expressions are compiled: a parse error
    // and an unknown field in an agent file, each at its spot.
    let agent = format!(
        "{ECHO}\n[[policies]]\nid = \"p\"\neffect = \"deny\"\nwhen = \"agent.colour == 'red'\"\n"
    );
    let gateway = "[[auth.policies]]\nid = \"cut\"\neffect = \"deny\"\nwhen = \"a2a.method ==\"\n";
    let got = problems(&[("echo.toml", &agent)], Some(gateway));
    for want in [
        "gateway.toml:4:22: policy \"cut\": ",
        "echo.toml:15:9: policy \"p\": agent has no field \"colour\" (it has: agent.name, agent.kind)",
    ] {
        assert!(got.iter().any(|g| g.starts_with(want)), "wanted {want:?} in {got:?}");
    }
}
