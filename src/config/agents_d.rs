//! `agents.d/`: one TOML file per agent, loaded in sorted order.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::{
    A2aConfig, Access, AgentDef, AgentMcp, BackendSpec, CommandConfig, Diagnostic, Diagnostics,
    ExtendedCard, Extension, PolicyConfig, Provider, Skill,
};

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentFile {
    #[schemars(with = "String")]
    name: Spanned<String>,
    /// Required, except for upstream agents, whose card supplies it.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    description: Option<Spanned<String>>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    provider: Option<Provider>,
    #[serde(default)]
    documentation_url: Option<String>,
    #[serde(default)]
    icon_url: Option<String>,
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    default_input_modes: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    default_output_modes: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    #[schemars(with = "Vec<Skill>")]
    skills: Vec<Spanned<Skill>>,
    /// What the extended card adds, for authenticated callers with access.
    #[serde(default)]
    #[schemars(with = "Option<ExtendedCard>")]
    extended: Option<Spanned<ExtendedCard>>,
    /// The A2A extensions the agent supports.
    #[serde(default)]
    #[schemars(with = "Vec<Extension>")]
    extensions: Vec<Spanned<Extension>>,
    backend: BackendSpec,
    #[serde(default)]
    limits: AgentLimits,
    #[serde(default)]
    access: Option<Access>,
    #[serde(default)]
    mcp: AgentMcp,
    /// Rules for calls to this agent (see `[[auth.policies]]` in gateway.toml).
    #[serde(default)]
    policies: Vec<PolicyConfig>,
}

#[derive(Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AgentLimits {
    #[schemars(with = "Option<usize>")]
    mailbox: Option<Spanned<usize>>,
    #[schemars(with = "Option<usize>")]
    max_concurrency: Option<Spanned<usize>>,
}

const MAX_NAME_LEN: usize = 64;

/// Lowercase letters, digits, `-` and `_`, starting with a letter or digit: safe in a URL
/// path segment without escaping, and unambiguous in logs.
fn check_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    if name.is_empty() {
        return Err("name must not be empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("name is longer than {MAX_NAME_LEN} characters"));
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return Err(format!(
            "name \"{name}\" must start with a lowercase letter or a digit"
        ));
    }
    if let Some(bad) = name.chars().find(|c| !ok_char(*c)) {
        return Err(format!(
            "name \"{name}\" contains '{bad}'; use lowercase letters, digits, '-' and '_' (it becomes part of the URL)"
        ));
    }
    Ok(())
}

/// A problem with an agent given as JSON: the field it is about (`backend.timeout_secs`,
/// `skills[1].id`; empty for the whole) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// An agent given as JSON (the admin API's `PUT /admin/v1/agents/{name}`: the agent file's
/// schema), checked exactly as `check` checks a file: the JSON is written out as the TOML
/// file it stands for and read by the same reader. `name` is the agent's (the JSON may
/// repeat it); `dir` is where its relative paths would start. Every problem, each naming
/// its field.
pub fn agent_from_json(
    name: &str,
    json: &serde_json::Value,
    dir: &Path,
) -> Result<AgentDef, Vec<FieldError>> {
    let whole = |message: String| {
        vec![FieldError {
            field: String::new(),
            message,
        }]
    };
    let serde_json::Value::Object(fields) = json else {
        return Err(whole(
            "an agent is a JSON object (the agent file's keys)".into(),
        ));
    };
    let mut fields = fields.clone();
    match fields.get("name") {
        None => {
            fields.insert("name".into(), serde_json::Value::String(name.into()));
        }
        Some(serde_json::Value::String(n)) if n == name => {}
        Some(other) => {
            return Err(vec![FieldError {
                field: "name".into(),
                message: format!("{other} is not the agent the path names (\"{name}\")"),
            }])
        }
    }
    let mut nulls = Vec::new();
    find_nulls(
        &serde_json::Value::Object(fields.clone()),
        String::new(),
        &mut nulls,
    );
    if !nulls.is_empty() {
        return Err(nulls
            .into_iter()
            .map(|field| FieldError {
                field,
                message: "null is not a value here: leave the key out".into(),
            })
            .collect());
    }
    let text = toml::to_string(&fields)
        .map_err(|e| whole(format!("cannot be written as an agent file: {e}")))?;
    let file = dir.join(format!("{name}.toml"));
    let mut diags = Diagnostics::default();
    let Parsed { agent, .. } = parse_agent(&file, &text, &mut diags);
    match agent {
        Some(agent) if diags.0.is_empty() => Ok(agent),
        _ => Err(diags
            .0
            .iter()
            .map(|d| {
                let at = field_at(&text, d.line);
                // A missing field is reported where its table starts: name it instead.
                let field = match missing_field(&d.message) {
                    Some(missing) => {
                        let table = at.rsplit_once('.').map_or("", |(t, _)| t);
                        let table = if text
                            .lines()
                            .nth(d.line.saturating_sub(1))
                            .is_some_and(|l| l.trim_start().starts_with('['))
                        {
                            at.as_str()
                        } else {
                            table
                        };
                        match table.is_empty() {
                            true => missing.to_string(),
                            false => format!("{table}.{missing}"),
                        }
                    }
                    None => at,
                };
                FieldError {
                    field,
                    message: d.message.clone(),
                }
            })
            .collect()),
    }
}

/// The field a "missing field `x`" message names.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

/// The paths of the nulls in `value` (TOML has none).
fn find_nulls(value: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Null => out.push(at),
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let path = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                find_nulls(v, path, out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                find_nulls(v, format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The field a line of an agent file written from JSON is about: its table's path (an
/// array of tables counted: `skills[1]`) and the line's key; the table alone for a line
/// that is a header, none for line 0 (the whole file).
fn field_at(text: &str, line: usize) -> String {
    let mut table = String::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut key = String::new();
    for (n, l) in text.lines().enumerate().take(line) {
        let l = l.trim();
        if let Some(name) = l.strip_prefix("[[").and_then(|r| r.strip_suffix("]]")) {
            let i = counts.entry(name.to_string()).or_insert(0);
            table = format!("{name}[{i}]");
            *i += 1;
            key.clear();
        } else if let Some(name) = l.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            // A table inside an array of tables stays under its element.
            table = match name.split_once('.') {
                Some((head, rest)) if counts.contains_key(head) => {
                    format!("{head}[{}].{rest}", counts[head] - 1)
                }
                _ => name.to_string(),
            };
            key.clear();
        } else if n + 1 == line {
            key = l
                .split('=')
                .next()
                .unwrap_or_default()
                .trim()
                .trim_matches('"')
                .to_string();
        }
    }
    match (table.is_empty(), key.is_empty()) {
        (true, _) => key,
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    }
}

/// Loads every `*.toml` in `dir`, adding a diagnostic per problem; returns the valid agents.
pub fn load_agents_dir(dir: &Path, diags: &mut Diagnostics) -> Vec<AgentDef> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            diags.push(Diagnostic::file(
                dir,
                format!("cannot read agents directory: {e}"),
            ));
            return Vec::new();
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .filter(|p| {
            !p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        diags.push(Diagnostic::file(
            dir,
            "no agent definitions (*.toml files) found",
        ));
        return Vec::new();
    }
    let mut agents: Vec<AgentDef> = Vec::new();
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    for file in files {
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                diags.push(Diagnostic::file(&file, format!("cannot read: {e}")));
                continue;
            }
        };
        let Parsed { agent, name } = parse_agent(&file, &text, diags);
        // Names are checked across files even when a file has other problems.
        if let Some((name, offset)) = name {
            if let Some(first) = seen.get(&name) {
                diags.push(Diagnostic::at(
                    &file,
                    &text,
                    offset,
                    format!(
                        "duplicate agent name \"{name}\" (already defined in {})",
                        first.display()
                    ),
                ));
                continue;
            }
            seen.insert(name, file.clone());
        }
        agents.extend(agent);
    }
    agents
}

/// One file's agent (None when the file has problems) and its name with where it is
/// written, when the name can be read at all.
struct Parsed {
    agent: Option<AgentDef>,
    name: Option<(String, usize)>,
}

/// Parses one file; every problem becomes a diagnostic.
fn parse_agent(file: &Path, text: &str, diags: &mut Diagnostics) -> Parsed {
    let raw: AgentFile = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            diags.push(Diagnostic::from_toml(file, text, &e));
            let name = check_what_reads(file, text, e.message(), diags);
            return Parsed { agent: None, name };
        }
    };
    let name = Some((raw.name.get_ref().clone(), raw.name.span().start));
    let agent = check_agent(file, text, raw, diags);
    Parsed { agent, name }
}

/// The semantic checks of a file that parsed.
fn check_agent(
    file: &Path,
    text: &str,
    raw: AgentFile,
    diags: &mut Diagnostics,
) -> Option<AgentDef> {
    let before = diags.0.len();
    let at = |offset: usize, msg: String| Diagnostic::at(file, text, offset, msg);
    if let Err(msg) = check_name(raw.name.get_ref()) {
        diags.push(at(raw.name.span().start, msg));
    }
    let remote = matches!(raw.backend, BackendSpec::A2a(_));
    match &raw.description {
        Some(d) if d.get_ref().trim().is_empty() => {
            diags.push(at(d.span().start, "description must not be empty".into()));
        }
        None if !remote => diags.push(at(
            0,
            "missing field `description` (only agents with kind = \"a2a\" may omit it)".into(),
        )),
        _ => {}
    }
    let mut backend = raw.backend;
    match &mut backend {
        BackendSpec::A2a(cfg) => check_a2a(
            cfg,
            &agent_dir(file),
            &mut |offset, msg| diags.push(at(offset, msg)),
            text,
        ),
        BackendSpec::Command(cfg) => check_command(
            cfg,
            file,
            &mut |offset, msg| diags.push(at(offset, msg)),
            text,
        ),
        BackendSpec::OpenAi(cfg) => {
            let report: &mut dyn FnMut(usize, String) =
                &mut |offset, msg| diags.push(at(offset, msg));
            check_headers(&mut cfg.headers, report, text);
            cfg.check(&agent_dir(file), report, text);
        }
        BackendSpec::Echo(_) => {}
    }
    for modes in [&raw.default_input_modes, &raw.default_output_modes]
        .into_iter()
        .flatten()
    {
        if modes.get_ref().is_empty() || modes.get_ref().iter().any(|m| m.trim().is_empty()) {
            diags.push(at(
                modes.span().start,
                "media type lists must be non-empty and hold no empty strings".into(),
            ));
        }
    }
    let mut skill_ids: HashMap<&str, ()> = HashMap::new();
    for skill in &raw.skills {
        let s = skill.get_ref();
        if s.id.trim().is_empty() {
            diags.push(at(skill.span().start, "skill id must not be empty".into()));
        } else if skill_ids.insert(&s.id, ()).is_some() {
            diags.push(at(
                skill.span().start,
                format!("duplicate skill id \"{}\"", s.id),
            ));
        }
    }
    if let Some(extended) = &raw.extended {
        // One id space: a caller sees the public skills and the extended ones together.
        for s in &extended.get_ref().skills {
            if s.id.trim().is_empty() {
                diags.push(at(
                    extended.span().start,
                    "skill id must not be empty".into(),
                ));
            } else if skill_ids.insert(&s.id, ()).is_some() {
                diags.push(at(
                    extended.span().start,
                    format!("duplicate skill id \"{}\" in [extended]", s.id),
                ));
            }
        }
    }
    let mut uris: HashMap<&str, ()> = HashMap::new();
    for extension in &raw.extensions {
        let uri = extension.get_ref().uri.trim();
        if uri.is_empty() {
            diags.push(at(
                extension.span().start,
                "extension uri must not be empty".into(),
            ));
        } else if uris.insert(uri, ()).is_some() {
            diags.push(at(
                extension.span().start,
                format!("extension \"{uri}\" is listed twice"),
            ));
        } else if reqwest::header::HeaderValue::from_str(uri).is_err() || uri.contains(',') {
            diags.push(at(
                extension.span().start,
                format!("extension uri \"{uri}\" cannot travel in the A2A-Extensions header"),
            ));
        }
    }
    for limit in [&raw.limits.mailbox, &raw.limits.max_concurrency]
        .into_iter()
        .flatten()
    {
        if *limit.get_ref() == 0 {
            diags.push(at(limit.span().start, "limits must be at least 1".into()));
        }
    }
    let mut policy_ids: HashMap<&str, ()> = HashMap::new();
    for policy in &raw.policies {
        let at_rule = policy.when.span().start;
        if !policy.agents.is_empty() {
            diags.push(at(
                at_rule,
                format!(
                    "policy \"{}\": an agent file's policies apply to its agent; drop agents",
                    policy.id
                ),
            ));
        }
        if let Err(e) = super::check_policy_id(&policy.id) {
            diags.push(at(at_rule, e));
        } else if policy_ids.insert(&policy.id, ()).is_some() {
            diags.push(at(
                at_rule,
                format!("policy \"{}\" is defined twice", policy.id),
            ));
        }
    }
    if diags.0.len() > before {
        return None;
    }
    let def = AgentDef {
        name: raw.name.into_inner(),
        description: raw.description.map(Spanned::into_inner).unwrap_or_default(),
        version: raw.version,
        provider: raw.provider,
        documentation_url: raw.documentation_url,
        icon_url: raw.icon_url,
        default_input_modes: raw.default_input_modes.map(Spanned::into_inner),
        default_output_modes: raw.default_output_modes.map(Spanned::into_inner),
        skills: raw.skills.into_iter().map(Spanned::into_inner).collect(),
        extended: raw.extended.map(Spanned::into_inner),
        extensions: raw
            .extensions
            .into_iter()
            .map(Spanned::into_inner)
            .collect(),
        backend,
        mailbox: raw.limits.mailbox.map(Spanned::into_inner),
        max_concurrency: raw.limits.max_concurrency.map(Spanned::into_inner),
        access: raw.access,
        mcp_tools: raw.mcp.tools,
        policies: raw.policies,
        source: file.to_path_buf(),
        runtime: false,
    };
    Some(def)
}

/// Every top-level key an agent file may hold.
const AGENT_KEYS: &[&str] = &[
    "name",
    "description",
    "version",
    "provider",
    "documentation_url",
    "icon_url",
    "default_input_modes",
    "default_output_modes",
    "skills",
    "extended",
    "extensions",
    "backend",
    "limits",
    "access",
    "mcp",
    "policies",
];

/// A file that does not parse as an agent may have more problems than the first one serde
/// stops at: checks what can still be read (unknown keys, the name, the description, the
/// backend) so one run of `check` reports them all. `first` is the message already
/// reported. Returns the name, when it is a string, for the duplicate check.
fn check_what_reads(
    file: &Path,
    text: &str,
    first: &str,
    diags: &mut Diagnostics,
) -> Option<(String, usize)> {
    let Ok(table) = toml::from_str::<BTreeMap<Spanned<String>, Spanned<toml::Value>>>(text) else {
        return None; // Not TOML at all: the syntax error is all there is to say.
    };
    let first = first.trim();
    let mut report = |offset: usize, message: String| {
        if message != first {
            diags.push(Diagnostic::at(file, text, offset, message));
        }
    };
    let mut name = None;
    let mut kind = None;
    for (key, value) in &table {
        match key.get_ref().as_str() {
            "name" => {
                if let toml::Value::String(n) = value.get_ref() {
                    let offset = value.span().start;
                    if let Err(msg) = check_name(n) {
                        report(offset, msg);
                    }
                    name = Some((n.clone(), offset));
                }
            }
            "backend" => {
                kind = value
                    .get_ref()
                    .get("kind")
                    .and_then(toml::Value::as_str)
                    .map(str::to_string);
                match value.get_ref().clone().try_into::<BackendSpec>() {
                    Ok(BackendSpec::Command(mut cfg)) => {
                        check_command(&mut cfg, file, &mut report, text)
                    }
                    Ok(BackendSpec::A2a(mut cfg)) => {
                        check_a2a(&mut cfg, &agent_dir(file), &mut report, text)
                    }
                    Ok(BackendSpec::OpenAi(mut cfg)) => {
                        check_headers(&mut cfg.headers, &mut report, text);
                        cfg.check(&agent_dir(file), &mut report, text);
                    }
                    Ok(BackendSpec::Echo(_)) => {}
                    Err(e) => report(value.span().start, e.message().trim().to_string()),
                }
            }
            known if AGENT_KEYS.contains(&known) => {}
            unknown => {
                let expected = AGENT_KEYS
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                report(
                    key.span().start,
                    format!("unknown field `{unknown}`, expected one of {expected}"),
                );
            }
        }
    }
    let description = table
        .iter()
        .find(|(k, _)| k.get_ref() == "description")
        .map(|(_, v)| v);
    match description {
        Some(d) if d.get_ref().as_str().is_some_and(|d| d.trim().is_empty()) => {
            report(d.span().start, "description must not be empty".into())
        }
        None if kind.as_deref() != Some("a2a") => report(
            0,
            "missing field `description` (only agents with kind = \"a2a\" may omit it)".into(),
        ),
        _ => {}
    }
    name
}

/// Checks an upstream agent's settings and expands `${VAR}` in its headers. Values inside
/// `[backend]` carry no spans (the table is read through its `kind` tag), so problems are
/// located by finding the offending text in the file.
fn check_a2a(cfg: &mut A2aConfig, dir: &Path, report: &mut dyn FnMut(usize, String), text: &str) {
    let find = |needle: &str| text.find(needle).unwrap_or(0);
    if !(cfg.url.starts_with("http://") || cfg.url.starts_with("https://")) {
        report(
            find(&cfg.url),
            format!("backend.url must be an http(s) URL, got \"{}\"", cfg.url),
        );
    }
    if let Some(p) = &cfg.protocol {
        if !matches!(p.as_str(), "0.3" | "1.0") {
            report(
                find("protocol"),
                format!("backend.protocol must be \"0.3\" or \"1.0\", got \"{p}\""),
            );
        }
    }
    for (key, value) in [
        ("timeout_secs", cfg.timeout_secs),
        ("connect_timeout_secs", cfg.connect_timeout_secs),
        ("card_refresh_secs", cfg.card_refresh_secs),
        ("retry_secs", cfg.retry_secs),
    ] {
        if value == 0 {
            report(find(key), format!("backend.{key} must be at least 1"));
        }
    }
    check_headers(&mut cfg.headers, report, text);
    check_card_keys(cfg, dir, report, text);
    check_upstream_tls(cfg, dir, report, text);
}

/// The upstream's TLS files, resolved against the agent file's directory and read now, so
/// that a missing or broken one is a load error rather than an unreachable agent.
fn check_upstream_tls(
    cfg: &mut A2aConfig,
    dir: &Path,
    report: &mut dyn FnMut(usize, String),
    text: &str,
) {
    let find = |needle: &str| text.find(needle).unwrap_or(0);
    if cfg.client_cert_file.is_some() != cfg.client_key_file.is_some() {
        report(
            find("client_"),
            "backend.client_cert_file and client_key_file go together".into(),
        );
        return;
    }
    for file in [
        &mut cfg.ca_file,
        &mut cfg.client_cert_file,
        &mut cfg.client_key_file,
    ]
    .into_iter()
    .flatten()
    {
        *file = dir.join(&*file);
    }
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = |path: &Path| {
        CertificateDer::pem_file_iter(path).and_then(|certs| {
            certs
                .count()
                .gt(&0)
                .then_some(())
                .ok_or(rustls::pki_types::pem::Error::NoItemsFound)
        })
    };
    for (setting, file) in [
        ("ca_file", &cfg.ca_file),
        ("client_cert_file", &cfg.client_cert_file),
    ] {
        if let Some(path) = file {
            if let Err(e) = certs(path) {
                report(
                    find(setting),
                    format!("backend.{setting} {}: {e}", path.display()),
                );
            }
        }
    }
    if let Some(path) = &cfg.client_key_file {
        if let Err(e) = PrivateKeyDer::from_pem_file(path) {
            report(
                find("client_key_file"),
                format!("backend.client_key_file {}: {e}", path.display()),
            );
        }
    }
}

/// A signature to check needs exactly one place to find the keys; a file is read now, so
/// that a missing or broken one is a load error rather than an unhealthy agent.
fn check_card_keys(
    cfg: &mut A2aConfig,
    dir: &Path,
    report: &mut dyn FnMut(usize, String),
    text: &str,
) {
    let find = |needle: &str| text.find(needle).unwrap_or(0);
    let given = (cfg.card_jwks_url.is_some(), cfg.card_jwks_file.is_some());
    if !cfg.verify_card_signature {
        if given != (false, false) {
            report(
                find("card_jwks"),
                "backend.card_jwks_url and card_jwks_file are read only with verify_card_signature = true".into(),
            );
        }
        return;
    }
    if given.0 == given.1 {
        report(
            find("verify_card_signature"),
            "verify_card_signature = true needs one of backend.card_jwks_url and backend.card_jwks_file".into(),
        );
        return;
    }
    if let Some(url) = &cfg.card_jwks_url {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            report(
                find(url),
                format!("backend.card_jwks_url must be an http(s) URL, got \"{url}\""),
            );
        }
    }
    if let Some(file) = &mut cfg.card_jwks_file {
        let path = dir.join(&*file);
        let read = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                serde_json::from_slice::<jsonwebtoken::jwk::JwkSet>(&bytes)
                    .map_err(|e| e.to_string())
            });
        match read {
            Ok(_) => *file = path,
            Err(e) => report(
                find("card_jwks_file"),
                format!(
                    "backend.card_jwks_file {}: not a JWKS ({e})",
                    path.display()
                ),
            ),
        }
    }
}

/// Checks the `headers` of a backend that calls out over HTTP and expands `${VAR}` in them.
fn check_headers(
    headers: &mut BTreeMap<String, String>,
    report: &mut dyn FnMut(usize, String),
    text: &str,
) {
    let find = |needle: &str| text.find(needle).unwrap_or(0);
    for (name, value) in headers.iter_mut() {
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            report(
                find(name),
                format!("\"{name}\" is not a valid HTTP header name"),
            );
        }
        match expand_env(value) {
            Ok(expanded) => *value = expanded,
            Err(var) => report(
                find(&format!("${{{var}}}")),
                format!("environment variable {var} (used in header {name}) is not set"),
            ),
        }
        if reqwest::header::HeaderValue::from_str(value).is_err() {
            report(
                find(name),
                format!("the value of header {name} is not a valid header value"),
            );
        }
    }
}

/// Checks a command agent: the program must exist and be executable now, not at the first
/// request. Relative paths (the program, `cwd`) are resolved against the agent file's
/// directory, which is also the process's working directory unless `cwd` names another,
/// so an agent file and its scripts can move together.
fn check_command(
    cfg: &mut CommandConfig,
    file: &Path,
    report: &mut dyn FnMut(usize, String),
    text: &str,
) {
    let find = |needle: &str| text.find(needle).unwrap_or(0);
    let Some(program) = cfg.command.first().cloned() else {
        report(
            find("command"),
            "backend.command must name a program".into(),
        );
        return;
    };
    let base = agent_dir(file);
    let cwd = match &cfg.cwd {
        Some(dir) => base.join(dir),
        None => base,
    };
    if !cwd.is_dir() {
        report(
            find("cwd"),
            format!("backend.cwd: {} is not a directory", cwd.display()),
        );
    }
    let found = if program.contains('/') {
        let path = cwd.join(&program);
        path.exists().then_some(path)
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(&program))
                .find(|p| p.is_file() && is_executable(p))
        })
    };
    match found {
        None => report(
            find(&program),
            format!(
                "backend.command: program \"{program}\" not found{}",
                if program.contains('/') {
                    format!(" (looked for {})", cwd.join(&program).display())
                } else {
                    " on PATH".into()
                },
            ),
        ),
        Some(path) if !(path.is_file() && is_executable(&path)) => report(
            find(&program),
            format!(
                "backend.command: {} is not an executable file",
                path.display()
            ),
        ),
        Some(path) => {
            if program.contains('/') {
                cfg.command[0] = path.display().to_string();
            }
        }
    }
    // Arguments that name files (the script of `python3 scripts/greet.py`): a typo there
    // would otherwise show only when a task runs.
    for arg in cfg.command.iter().skip(1) {
        if super::looks_like_file(arg) && !cwd.join(arg).is_file() {
            report(
                find(arg),
                format!(
                    "backend.command: argument \"{arg}\" names no file (looked for {})",
                    cwd.join(arg).display()
                ),
            );
        }
    }
    cfg.cwd = Some(cwd);
    if cfg.timeout_secs == 0 || cfg.max_concurrent == 0 {
        report(
            find("[backend]"),
            "backend.timeout_secs and max_concurrent must be at least 1".into(),
        );
    }
    if cfg.max_waiting == 0 {
        report(
            find("max_waiting"),
            "backend.max_waiting must be at least 1".into(),
        );
    }
    for (name, value) in cfg.env.iter_mut() {
        match expand_env(value) {
            Ok(v) => *value = v,
            Err(var) => report(
                find(&format!("${{{var}}}")),
                format!("environment variable {var} (used in env {name}) is not set"),
            ),
        }
    }
}

/// Replaces every `${VAR}` with the variable's value; the first unset one is the error.
fn expand_env(value: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start + 2..].find('}') else {
            break;
        };
        let var = &rest[start + 2..start + 2 + len];
        let val = std::env::var(var).map_err(|_| var.to_string())?;
        out.push_str(&rest[..start]);
        out.push_str(&val);
        rest = &rest[start + 3 + len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The agent file's directory, absolute: what paths in the file are relative to.
fn agent_dir(file: &Path) -> PathBuf {
    file.parent()
        .map(absolute)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// `dir` made absolute against the gateway's working directory, so a process started with
/// another working directory still finds what it names.
fn absolute(dir: &Path) -> PathBuf {
    if dir.as_os_str().is_empty() {
        return std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    }
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_expansion() {
        std::env::set_var("A2A_GW_TEST_TOKEN", "s3cret");
        assert_eq!(
            expand_env("Bearer ${A2A_GW_TEST_TOKEN}").unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(expand_env("plain").unwrap(), "plain");
        assert_eq!(expand_env("${A2A_GW_NOPE_X}").unwrap_err(), "A2A_GW_NOPE_X");
    }

    #[test]
    fn names_must_be_url_safe() {
        assert!(check_name("echo-2_b").is_ok());
        for bad in ["", "Echo", "-x", "a/b", "a b", "é"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
