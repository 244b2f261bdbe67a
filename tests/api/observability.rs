//! What operators open: the Grafana dashboard and the Prometheus alerting rules in deploy/
//! name only metric families and labels the gateway exports (read from a live `/metrics`
//! after a mixed workload), and every expression is PromQL that promtool accepts.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::helpers::{repo_root, sha, spawn_with, TestGateway, D, ECHO};

/// Labels Prometheus adds to every series it scrapes.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// Metric families and the labels each carries, from the exposition text.
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut families: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let label = regex::Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)="#).unwrap();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = families.entry(line[..name_end].to_string()).or_default();
        if let Some(set) = line[name_end..]
            .strip_prefix('{')
            .and_then(|r| r.split_once('}'))
        {
            labels.extend(label.captures_iter(set.0).map(|c| c[1].to_string()));
        }
    }
    families
}

/// The metric names and label names a PromQL expression reads. Names are what is followed
/// by `{` or `[`, or stands alone where a series may; labels are matchers' left-hand sides
/// and what `by (...)` / `without (...)` list.
fn read_by(expr: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let strings = regex::Regex::new(r#""(?:[^"\\]|\\.)*""#).unwrap();
    let expr = strings.replace_all(expr, "\"\"");
    let grouping = regex::Regex::new(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)").unwrap();
    let selector = regex::Regex::new(r"\{([^}]*)\}").unwrap();
    let matcher = regex::Regex::new(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)").unwrap();
    let mut labels = BTreeSet::new();
    for g in grouping.captures_iter(&expr) {
        labels.extend(
            g[1].split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from),
        );
    }
    for s in selector.captures_iter(&expr) {
        labels.extend(matcher.captures_iter(&s[1]).map(|c| c[1].to_string()));
    }
    let rest = grouping.replace_all(&expr, " ");
    let rest = selector.replace_all(&rest, " ");
    let rest = regex::Regex::new(r"\[[^\]]*\]")
        .unwrap()
        .replace_all(&rest, " ");
    let word = regex::Regex::new(r"[a-zA-Z_:][a-zA-Z0-9_:]*").unwrap();
    let not_series = [
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "rate",
        "irate",
        "increase",
        "changes",
        "histogram_quantile",
        "by",
        "without",
        "on",
        "ignoring",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "group_left",
        "group_right",
        "topk",
        "bottomk",
        "abs",
        "clamp_min",
        "humanizePercentage",
    ];
    let names = word
        .find_iter(&rest)
        .map(|m| m.as_str())
        .filter(|w| !not_series.contains(w))
        .map(String::from)
        .collect();
    (names, labels)
}

/// Every expression names exported families, and only labels one of them carries.
fn check_against(
    what: &str,
    expr: &str,
    families: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let (names, labels) = read_by(expr);
    let mut problems = Vec::new();
    if names.is_empty() {
        problems.push(format!("{what}: no metric in `{expr}`"));
    }
    let mut carried: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
    for name in &names {
        match families.get(name) {
            Some(l) => carried.extend(l.iter().cloned()),
            None => problems.push(format!("{what}: `{name}` is not exported")),
        }
    }
    for label in labels.difference(&carried) {
        problems.push(format!("{what}: label `{label}` is on none of {names:?}"));
    }
    problems
}

/// Every expression of the dashboard: panels' targets, its variables' queries, and its
/// annotations; with Grafana's variables given values, as Grafana would.
fn dashboard_expressions(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut panels: Vec<&Value> = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        panels.push(p);
        panels.extend(p["panels"].as_array().into_iter().flatten());
    }
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?");
            out.push((
                format!("panel \"{title}\""),
                t["expr"].as_str().expect("expr").into(),
            ));
        }
    }
    for a in dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(e) = a["expr"].as_str() {
            out.push((format!("annotation \"{}\"", a["name"]), e.into()));
        }
    }
    let values =
        regex::Regex::new(r"^label_values\(([a-zA-Z0-9_:]+),\s*([a-zA-Z0-9_]+)\)$").unwrap();
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(q) = v["definition"].as_str() {
            let c = values
                .captures(q)
                .unwrap_or_else(|| panic!("variable query `{q}`: label_values(metric, label)"));
            out.push((
                format!("variable {}", v["name"]),
                format!("count by ({}) ({})", &c[2], &c[1]),
            ));
        }
    }
    let grafana = [
        ("$__rate_interval", "1m"),
        ("$__range", "1h"),
        ("$agent", ".*"),
    ];
    out.into_iter()
        .map(|(what, e)| {
            let e = grafana
                .iter()
                .fold(e, |e, (var, value)| e.replace(var, value));
            assert!(!e.contains('$'), "{what}: a variable left in `{e}`");
            (what, e)
        })
        .collect()
}

/// A workload that makes the gateway export every family the dashboard reads: calls that
/// succeed and fail, a stream, an upstream agent, a command agent, a push delivery, a
/// refused credential, a rate-limited caller, a reload, and a durable store.
async fn after_a_mixed_workload() -> (TestGateway, String, crate::peers::Peer) {
    let upstream = crate::peers::python_agent_with("1.0", &[]).await;
    let receiver = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let hook = receiver.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = receiver.accept().await {
            let mut buf = vec![0u8; 65536];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await;
        }
    });
    let command = "name = \"upper\"\ndescription = \"test\"\n[backend]\nkind = \"command\"\nio = \"text\"\ncommand = [\"tr\", \"a-z\", \"A-Z\"]\n";
    let gateway = format!(
        "default_agent = \"echo\"\n[store]\nkind = \"sqlite\"\n\
         [push]\nenabled = true\nallow_http = true\nallow = [\"127.0.0.1\"]\n\
         [[auth.api_keys]]\nid = \"tiny\"\nsecret_sha256 = \"{}\"\ntier = \"tiny\"\n\
         [rate_limits.tiers.tiny]\nrequests_per_minute = 1\nburst = 1\n",
        sha("tiny-key")
    );
    let up = crate::peers::upstream_agent("up", &format!("http://127.0.0.1:{}", upstream.port), "");
    let gw = spawn_with(
        &[
            ("echo.toml", ECHO),
            ("up.toml", &up),
            ("upper.toml", command),
        ],
        &gateway,
    )
    .await;
    for agent in ["echo", "up", "upper"] {
        let sent = gw
            .call(
                &format!("/a2a/agents/{agent}"),
                D::V10,
                "SendMessage",
                json!({"message": D::V10.message("hello")}),
            )
            .await;
        assert!(sent.body.get("result").is_some(), "{agent}: {}", sent.body);
    }
    let streamed = gw
        .sse(
            "/a2a/agents/echo",
            D::V10,
            "SendStreamingMessage",
            json!({"message": D::V10.message("a b c")}),
        )
        .await;
    assert!(!streamed.is_empty());
    let _ = gw
        .call("/a2a/agents/echo", D::V10, "GetTask", json!({"id": "nope"}))
        .await;
    let pushed = gw
        .call(
            "/a2a/agents/echo",
            D::V10,
            "SendMessage",
            json!({"message": D::V10.message("/delay 0.2 pushed"),
                   "configuration": {"pushNotificationConfig":
                       {"url": format!("http://127.0.0.1:{hook}/hook")}}}),
        )
        .await;
    assert!(pushed.body.get("result").is_some(), "{}", pushed.body);
    for key in ["wrong-key", "tiny-key", "tiny-key", "tiny-key"] {
        let _ = gw
            .client
            .get(gw.url("/a2a/agents/echo/card"))
            .header("X-API-Key", key)
            .send()
            .await;
        let _ = gw
            .client
            .post(gw.url("/a2a/agents/echo"))
            .header("X-API-Key", key)
            .header("A2A-Version", "1.0")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}))
            .send()
            .await;
    }
    let metrics = wait_for_metrics(
        &gw,
        &["a2a_push_notifications_total{outcome=\"delivered\"} 1"],
    )
    .await;
    (gw, metrics, upstream)
}

/// `/metrics` once it says each of `want` (things that happen after the answer).
async fn wait_for_metrics(gw: &TestGateway, want: &[&str]) -> String {
    let mut text = String::new();
    for _ in 0..100 {
        text = gw.metrics().await;
        if want.iter().all(|w| text.contains(w)) {
            return text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("/metrics never said {want:?}:\n{text}");
}

/// promtool's verdict on a rules file: its output, or a panic with it.
fn promtool_check_rules(file: &std::path::Path) -> String {
    let promtool = crate::helpers::provided_by("scripts/promtool.sh", "provide promtool");
    let out = std::process::Command::new(&promtool)
        .args(["check", "rules"])
        .arg(file)
        .output()
        .expect("promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check rules {}:\n{text}",
        file.display()
    );
    text
}

#[tokio::test]
async fn the_dashboard_and_the_alerts_read_only_what_the_gateway_exports() {
    let (_gw, metrics, _upstream) = after_a_mixed_workload().await;
    let families = exported(&metrics);
    let root = repo_root();

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/a2a-gateway.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "a2a-gateway");
    let expressions = dashboard_expressions(&dashboard);
    assert!(expressions.len() > 25, "{} expressions", expressions.len());
    let mut problems = Vec::new();
    for (what, expr) in &expressions {
        problems.extend(check_against(what, expr, &families));
    }
    // What the issue asks the dashboard to show, each read by some panel.
    for family in [
        "a2a_requests_total",
        "a2a_request_duration_seconds_bucket",
        "a2a_tasks",
        "a2a_open_streams",
        "a2a_upstream_call_duration_seconds_bucket",
        "a2a_upstream_calls_total",
        "a2a_push_notifications_total",
        "a2a_store_commit_seconds_bucket",
        "a2a_store_commit_failures_total",
        "a2a_config_reloads_total",
        "a2a_rate_limited_total",
        "a2a_connections_refused_total",
        "a2a_build_info",
    ] {
        if !expressions
            .iter()
            .any(|(_, e)| read_by(e).0.contains(family))
        {
            problems.push(format!("no panel reads {family}"));
        }
    }
    // The expressions are PromQL: promtool checks them as recording rules.
    let dir = tempfile::tempdir().unwrap();
    let rules: Vec<Value> = expressions
        .iter()
        .enumerate()
        .map(|(i, (_, e))| json!({"record": format!("dashboard:expr_{i}"), "expr": e}))
        .collect();
    let file = dir.path().join("dashboard-rules.json");
    std::fs::write(
        &file,
        json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string(),
    )
    .unwrap();
    promtool_check_rules(&file);

    let alerts_file = root.join("deploy/prometheus/alerts.yaml");
    let checked = promtool_check_rules(&alerts_file);
    assert!(checked.contains("SUCCESS: 4 rules found"), "{checked}");
    let alerts: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&alerts_file).unwrap()).unwrap();
    for rule in alerts["groups"][0]["rules"].as_array().unwrap() {
        problems.extend(check_against(
            &format!("alert {}", rule["alert"]),
            rule["expr"].as_str().unwrap(),
            &families,
        ));
    }
    assert!(
        problems.is_empty(),
        "the dashboard or the alerts drifted from /metrics:\n{}\n\nexported: {:?}",
        problems.join("\n"),
        families.keys().collect::<Vec<_>>()
    );
}
