//! One policy's `when`: a CEL expression, parsed and checked once at load, evaluated per
//! request against that request's [`Facts`].
//!
//! The names an expression may read are fixed (see docs/security.md#policies). At load,
//! every `caller.x`, `agent.x`, `a2a.x`, `time.now` and `request.header('name')` is checked
//! against them (a typo is a load error with its position, not a silent false) and
//! rewritten into one flat variable (`caller.id`, `request.header:x-team`), which the
//! request's facts answer by name: no map of facts is built per request, and a fact the
//! expression does not read is never looked at.

use std::sync::Arc;

use cel::common::ast::{Expr, IdedExpr};
use cel::common::types::{CelBool, CelMap, CelString, CelTimestamp};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::{Context, Env, Value};

/// The fields of each root name, as an expression writes them.
const FIELDS: &[(&str, &[&str])] = &[
    ("caller", &["id", "kind", "tier", "claims"]),
    ("agent", &["name", "kind"]),
    (
        "a2a",
        &[
            "method",
            "operation",
            "dialect",
            "binding",
            "skill",
            "streaming",
        ],
    ),
    ("time", &["now"]),
];

/// Headers that carry credentials: a policy never reads them.
const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "cookie",
    "set-cookie",
];

/// Type names CEL lets an expression write as identifiers (`type(x) == string`).
const TYPE_NAMES: &[&str] = &[
    "bool",
    "bytes",
    "double",
    "duration",
    "int",
    "list",
    "map",
    "null_type",
    "string",
    "timestamp",
    "type",
    "uint",
];

/// A problem with an expression, at a byte offset of its source.
#[derive(Debug)]
pub(crate) struct CompileError {
    pub(crate) offset: usize,
    pub(crate) message: String,
}

/// What evaluating an expression reads that costs something to gather: the skill (read
/// from the request's metadata), the JWT's claims, named headers.
#[derive(Debug, Default, Clone)]
pub(crate) struct Reads {
    pub(crate) skill: bool,
    pub(crate) headers: Vec<String>,
}

/// A checked, rewritten expression.
#[derive(Debug)]
pub(crate) struct Compiled {
    expr: IdedExpr,
    pub(crate) reads: Reads,
    /// What is likely not meant (a rule on one method of a pair), at its offset.
    pub(crate) warnings: Vec<CompileError>,
}

/// Methods that do the same thing one way and the other: a rule naming one of them is
/// gone around through the other (and a tool call over MCP streams).
const PAIRS: &[(&str, &str, &str)] = &[
    ("SendMessage", "SendStreamingMessage", "send"),
    ("GetTask", "SubscribeToTask", "get or subscribe"),
];

/// What a method does, whatever the binding, dialect or streaming variant it comes as:
/// `a2a.operation`. Empty for a method not known here.
pub(crate) fn operation_of(method: &str) -> &'static str {
    match method {
        "SendMessage" | "SendStreamingMessage" => "send",
        "GetTask" => "get",
        "ListTasks" => "list",
        "CancelTask" => "cancel",
        "SubscribeToTask" => "subscribe",
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => "push_config",
        "GetExtendedAgentCard" => "card",
        _ => "",
    }
}

/// The warnings of an expression that compares `a2a.method` with `literals` (each with its
/// offset): one method of a pair without the other, or a method name of another dialect
/// (`a2a.method` is always the 1.0 name).
fn method_warnings(literals: &[(String, usize)]) -> Vec<CompileError> {
    let named = |m: &str| literals.iter().any(|(l, _)| l == m);
    let mut warnings = Vec::new();
    for (text, offset) in literals {
        let partner = PAIRS.iter().find_map(|(a, b, op)| match text.as_str() {
            t if t == *a => Some((*b, *op)),
            t if t == *b => Some((*a, *op)),
            _ => None,
        });
        if let Some((partner, op)) = partner {
            if !named(partner) {
                let ops = op
                    .split(" or ")
                    .map(|o| format!("'{o}'"))
                    .collect::<Vec<_>>();
                warnings.push(CompileError {
                    offset: *offset,
                    message: format!(
                        "names {text} but not {partner}: a caller does the same with the other (an MCP tool call streams); a2a.operation in [{}] covers every binding and variant",
                        ops.join(", ")
                    ),
                });
            }
            continue;
        }
        let other_dialect = crate::protocol::jsonrpc::Method::lookup(text)
            .filter(|(_, d)| *d != crate::protocol::Dialect::V10);
        if let Some((method, _)) = other_dialect {
            warnings.push(CompileError {
                offset: *offset,
                message: format!(
                    "a2a.method is the A2A 1.0 name whatever the caller's dialect: '{text}' never matches; write '{}' (or a2a.operation == '{}')",
                    method.name(),
                    operation_of(method.name())
                ),
            });
        }
    }
    warnings
}

pub(crate) fn compile(source: &str) -> Result<Compiled, CompileError> {
    let program = cel::Program::compile(source).map_err(|errors| {
        let first = errors.errors.first();
        let (line, col) = first.map_or((1, 1), |e| e.pos);
        CompileError {
            offset: offset_of(source, line, col),
            message: first.map_or_else(|| "does not parse".into(), |e| e.msg.clone()),
        }
    })?;
    let mut checker = Checker {
        info: program.source_info(),
        bound: Vec::new(),
        reads: Reads::default(),
        literals: Vec::new(),
        reads_method: false,
    };
    let mut expr = program.expression().clone();
    checker.check(&mut expr)?;
    let warnings = match checker.reads_method {
        true => method_warnings(&checker.literals),
        false => Vec::new(),
    };
    Ok(Compiled {
        expr,
        reads: checker.reads,
        warnings,
    })
}

/// The byte offset of a (1-based) line and column of `source`.
fn offset_of(source: &str, line: isize, col: isize) -> usize {
    let line = usize::try_from(line.max(1)).unwrap_or(1);
    let col = usize::try_from(col.max(1)).unwrap_or(1);
    let start: usize = source
        .split_inclusive('\n')
        .take(line - 1)
        .map(str::len)
        .sum();
    (start + col - 1).min(source.len())
}

struct Checker<'p> {
    info: &'p cel::common::ast::SourceInfo,
    /// Names bound by the macros around the node being checked (`exists(g, ...)`).
    bound: Vec<String>,
    reads: Reads,
    /// The string literals of the expression, with their offsets.
    literals: Vec<(String, usize)>,
    /// Whether it reads `a2a.method`.
    reads_method: bool,
}

impl Checker<'_> {
    fn error(&self, node: &IdedExpr, message: String) -> CompileError {
        let offset = self.info.offset_for(node.id).map_or(0, |(start, _)| start);
        CompileError {
            offset: offset as usize,
            message,
        }
    }

    fn check(&mut self, node: &mut IdedExpr) -> Result<(), CompileError> {
        if let Some(flat) = self.flatten(node)? {
            node.expr = Expr::Ident(flat);
            return Ok(());
        }
        let bound = &self.bound;
        match &mut node.expr {
            Expr::Ident(name) => {
                let name = name.clone();
                if bound.contains(&name) || TYPE_NAMES.contains(&name.as_str()) {
                    return Ok(());
                }
                let message = match name.as_str() {
                    "request" => "request is read with request.header('name')".into(),
                    root if FIELDS.iter().any(|(r, _)| *r == root) => {
                        format!("{root} is read by its fields: {}", fields_of(root))
                    }
                    _ => format!(
                        "unknown name \"{name}\"; an expression reads caller, agent, a2a, request and time"
                    ),
                };
                Err(self.error(node, message))
            }
            Expr::Select(select) => self.check(&mut select.operand),
            Expr::Call(call) => {
                if let Some(target) = &mut call.target {
                    self.check(target)?;
                }
                for arg in &mut call.args {
                    self.check(arg)?;
                }
                Ok(())
            }
            Expr::Comprehension(c) => {
                self.check(&mut c.iter_range)?;
                self.check(&mut c.accu_init)?;
                let names = [Some(c.iter_var.clone()), c.iter_var2.clone()];
                let before = self.bound.len();
                self.bound.extend(names.into_iter().flatten());
                self.bound.push(c.accu_var.clone());
                let checked = (self.check(&mut c.loop_cond))
                    .and_then(|()| self.check(&mut c.loop_step))
                    .and_then(|()| self.check(&mut c.result));
                self.bound.truncate(before);
                checked
            }
            Expr::List(list) => list.elements.iter_mut().try_for_each(|e| self.check(e)),
            Expr::Map(map) => map
                .entries
                .iter_mut()
                .try_for_each(|entry| match &mut entry.expr {
                    cel::common::ast::EntryExpr::MapEntry(e) => {
                        self.check(&mut e.key)?;
                        self.check(&mut e.value)
                    }
                    cel::common::ast::EntryExpr::StructField(f) => self.check(&mut f.value),
                }),
            Expr::Struct(_) => Err(self.error(node, "message literals are not supported".into())),
            Expr::Literal(cel::common::ast::LiteralValue::String(text)) => {
                let offset = self.info.offset_for(node.id).map_or(0, |(start, _)| start);
                self.literals
                    .push((text.inner().to_string(), offset as usize));
                Ok(())
            }
            Expr::Literal(_) | Expr::Unspecified => Ok(()),
        }
    }

    /// The flat variable a fact's select or `request.header('name')` call becomes; none for
    /// a node that is neither; an error for one that names no fact.
    fn flatten(&mut self, node: &IdedExpr) -> Result<Option<String>, CompileError> {
        match &node.expr {
            Expr::Select(select) => {
                let Expr::Ident(root) = &select.operand.expr else {
                    return Ok(None);
                };
                let Some((root, fields)) = FIELDS.iter().find(|(r, _)| r == root) else {
                    return Ok(None);
                };
                if self.bound.iter().any(|b| b == root) {
                    return Ok(None);
                }
                let field = select.field.as_str();
                if !fields.contains(&field) {
                    return Err(self.error(
                        &select.operand,
                        format!(
                            "{root} has no field \"{field}\" (it has: {})",
                            fields_of(root)
                        ),
                    ));
                }
                if select.test {
                    return Err(self.error(
                        node,
                        format!("{root}.{field} is always set; has() tests caller.claims fields"),
                    ));
                }
                match (*root, field) {
                    ("a2a", "skill") => self.reads.skill = true,
                    ("a2a", "method") => self.reads_method = true,
                    _ => {}
                }
                Ok(Some(format!("{root}.{field}")))
            }
            Expr::Call(call) => {
                let Some(target) = &call.target else {
                    return Ok(None);
                };
                if !matches!(&target.expr, Expr::Ident(r) if r == "request")
                    || self.bound.iter().any(|b| b == "request")
                {
                    return Ok(None);
                }
                if call.func_name != "header" {
                    return Err(self.error(
                        target,
                        format!(
                            "request has no function \"{}\"; it has header('name')",
                            call.func_name
                        ),
                    ));
                }
                let name = match call.args.as_slice() {
                    [IdedExpr {
                        expr: Expr::Literal(cel::common::ast::LiteralValue::String(name)),
                        ..
                    }] => name.inner().to_ascii_lowercase(),
                    _ => {
                        return Err(self.error(
                            target,
                            "request.header takes one header name, a string literal".into(),
                        ))
                    }
                };
                if SECRET_HEADERS.contains(&name.as_str()) {
                    return Err(self.error(
                        target,
                        format!("request.header('{name}'): a policy may not read credentials"),
                    ));
                }
                if !self.reads.headers.contains(&name) {
                    self.reads.headers.push(name.clone());
                }
                Ok(Some(format!("request.header:{name}")))
            }
            _ => Ok(None),
        }
    }
}

fn fields_of(root: &str) -> String {
    let fields = FIELDS.iter().find(|(r, _)| *r == root).map(|(_, f)| *f);
    let fields = fields.unwrap_or_default().iter();
    fields
        .map(|f| format!("{root}.{f}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a request shows its policies. Borrowed from the request: gathering them costs
/// a few pointer copies; what an expression reads is made into a CEL value on reading.
pub(crate) struct Facts<'r> {
    pub(crate) caller_id: &'r str,
    /// anonymous, api_key, bearer, jwt, client_certificate.
    pub(crate) caller_kind: &'static str,
    pub(crate) caller_tier: &'r str,
    pub(crate) claims: Option<&'r serde_json::Map<String, serde_json::Value>>,
    pub(crate) agent_name: &'r str,
    pub(crate) agent_kind: &'static str,
    pub(crate) method: &'static str,
    pub(crate) dialect: &'static str,
    pub(crate) binding: &'static str,
    /// Empty when nothing names one.
    pub(crate) skill: &'r str,
    pub(crate) streaming: bool,
    /// The headers the policies read, lowercase, with their values (absent: not listed).
    pub(crate) headers: &'r [(&'r str, &'r str)],
}

impl VariableResolver for Facts<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let text = |s: &'b str| -> Option<CowVal<'b, 'b>> {
            Some(CowVal::Owned(Box::new(CelString::from(s))))
        };
        match variable {
            "caller.id" => text(self.caller_id),
            "caller.kind" => text(self.caller_kind),
            "caller.tier" => text(self.caller_tier),
            "caller.claims" => Some(CowVal::Owned(claims(self.claims))),
            "agent.name" => text(self.agent_name),
            "agent.kind" => text(self.agent_kind),
            "a2a.method" => text(self.method),
            "a2a.operation" => text(operation_of(self.method)),
            "a2a.dialect" => text(self.dialect),
            "a2a.binding" => text(self.binding),
            "a2a.skill" => text(self.skill),
            "a2a.streaming" => Some(CowVal::Owned(Box::new(CelBool::from(self.streaming)))),
            "time.now" => {
                let now = chrono::Utc::now().fixed_offset();
                Some(CowVal::Owned(Box::new(CelTimestamp::from(now))))
            }
            other => {
                let name = other.strip_prefix("request.header:")?;
                let value = self.headers.iter().find(|(n, _)| *n == name);
                text(value.map_or("", |(_, v)| v))
            }
        }
    }
}

/// A token's claims as a CEL map; none (no JWT) is an empty map, so `has(caller.claims.x)`
/// is false rather than an error.
fn claims(claims: Option<&serde_json::Map<String, serde_json::Value>>) -> Box<dyn Val> {
    let value = claims.and_then(|c| cel::to_value(c).ok());
    value
        .and_then(|v| Box::<dyn Val>::try_from(v).ok())
        .unwrap_or_else(|| Box::new(CelMap::default()))
}

impl Compiled {
    /// Whether the expression holds for `facts`; an error when it cannot be evaluated
    /// (a missing claim, a comparison of unlike types) or yields something not a bool.
    pub(crate) fn holds(&self, env: &Arc<Env>, facts: &Facts<'_>) -> Result<bool, String> {
        let mut context = Context::with_env(env.clone());
        context.set_variable_resolver(facts);
        match Value::resolve(&self.expr, &context) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("yields {other:?}, not a bool")),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts<'static> {
        Facts {
            caller_id: "key:reader",
            caller_kind: "api_key",
            caller_tier: "default",
            claims: None,
            agent_name: "echo",
            agent_kind: "echo",
            method: "GetTask",
            dialect: "1.0",
            binding: "jsonrpc",
            skill: "",
            streaming: false,
            headers: &[("x-team", "finance")],
        }
    }

    fn eval(source: &str) -> Result<bool, String> {
        let env = Arc::new(Env::stdlib());
        compile(source)
            .map_err(|e| e.message)?
            .holds(&env, &facts())
    }

    #[test]
    fn facts_are_read_by_name() {
        assert_eq!(eval("a2a.method == 'GetTask'"), Ok(true));
        assert_eq!(
            eval("caller.kind == 'api_key' && agent.name == 'echo'"),
            Ok(true)
        );
        assert_eq!(
            eval("a2a.method in ['CancelTask', 'DeleteTask']"),
            Ok(false)
        );
        assert_eq!(eval("request.header('X-Team') == 'finance'"), Ok(true));
        assert_eq!(eval("request.header('x-other') == ''"), Ok(true));
        assert_eq!(eval("!a2a.streaming"), Ok(true));
        assert_eq!(eval("caller.id.startsWith('key:')"), Ok(true));
        assert_eq!(
            eval("time.now > timestamp('2020-01-01T00:00:00Z')"),
            Ok(true)
        );
        // The documented window: hours in a named zone.
        let hours =
            "time.now.getHours('Europe/Paris') >= 0 && time.now.getHours('Europe/Paris') < 24";
        assert_eq!(eval(hours), Ok(true));
        assert_eq!(eval("a2a.method.matches('^Get')"), Ok(true));
        assert_eq!(eval("!has(caller.claims.team)"), Ok(true));
        assert_eq!(eval("a2a.operation == 'get'"), Ok(true));
        assert_eq!(eval("[1, 2].exists(x, x == 2)"), Ok(true));
    }

    #[test]
    fn every_method_has_its_operation() {
        use crate::protocol::jsonrpc::Method;
        for (name, op) in [
            ("message/send", "send"),
            ("message/stream", "send"),
            ("tasks/send", "send"),
            ("tasks/sendSubscribe", "send"),
            ("tasks/get", "get"),
            ("ListTasks", "list"),
            ("tasks/cancel", "cancel"),
            ("tasks/resubscribe", "subscribe"),
            ("tasks/pushNotificationConfig/set", "push_config"),
            ("tasks/pushNotificationConfig/delete", "push_config"),
            ("agent/getAuthenticatedExtendedCard", "card"),
        ] {
            let (method, _) = Method::lookup(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(operation_of(method.name()), op, "{name}");
        }
    }

    #[test]
    fn one_method_of_a_pair_or_of_another_dialect_is_warned_about() {
        let warned = |source: &str| -> Vec<(usize, String)> {
            let compiled = compile(source).unwrap();
            (compiled.warnings.into_iter())
                .map(|w| (w.offset, w.message))
                .collect()
        };
        let w = warned("a2a.method == 'SendMessage'");
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, 14);
        assert!(w[0].1.contains("not SendStreamingMessage"), "{}", w[0].1);
        assert!(w[0].1.contains("a2a.operation in ['send']"), "{}", w[0].1);
        assert!(warned("a2a.method in ['SendMessage', 'SendStreamingMessage']").is_empty());
        assert!(warned("a2a.operation == 'send'").is_empty());
        // A literal compared with something else is not a method.
        assert!(warned("agent.name == 'SendMessage'").is_empty());
        let w = warned("a2a.method == 'message/send'");
        assert!(w[0].1.contains("write 'SendMessage'"), "{}", w[0].1);
        let w = warned("a2a.method == 'SubscribeToTask'");
        assert!(w[0].1.contains("not GetTask"), "{}", w[0].1);
    }

    #[test]
    fn a_missing_claim_is_an_error_at_run_time() {
        assert!(eval("caller.claims.team == 'x'").is_err());
        assert!(eval("a2a.method").is_err());
    }

    #[test]
    fn typos_are_load_errors_with_their_position() {
        let e = compile("a2a.metod == 'x'").unwrap_err();
        assert!(
            e.message.contains("a2a has no field \"metod\""),
            "{}",
            e.message
        );
        assert_eq!(e.offset, 0);
        let e = compile("a2a.method == 'x' && caler.id == ''").unwrap_err();
        assert!(
            e.message.contains("unknown name \"caler\""),
            "{}",
            e.message
        );
        assert_eq!(e.offset, 21);
        assert!(compile("request.header('Authorization') == ''").is_err());
        assert!(compile("request.header(a2a.method) == ''").is_err());
        assert!(compile("caller == 1").is_err());
        let e = compile("a2a.method ==").unwrap_err();
        assert_eq!(e.offset, 13, "{}", e.message);
    }
}
