//! Policies: rules in CEL over what a request is (its caller, agent, method, skill, headers,
//! the time), from `[[auth.policies]]` and agents' `[[policies]]`, compiled at load and
//! swapped with the rest of the configuration.
//!
//! A request passes when no deny rule that applies to its agent holds, and, where allow
//! rules apply to its agent, one of them holds. A rule that cannot be evaluated (a missing
//! claim) counts as denying, and is logged once. See docs/security.md#policies.

mod expr;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::config::{AgentDef, Effect, PolicyConfig};

pub(crate) use expr::Facts;

/// A rule that could not be compiled: where its `when` is, and where in it the problem is.
pub(crate) struct PolicyError {
    pub(crate) file: PathBuf,
    /// The byte offset of the `when` value in the file (its opening quote).
    pub(crate) when_at: usize,
    /// The byte offset of the problem in the expression.
    pub(crate) offset: usize,
    pub(crate) message: String,
}

struct Rule {
    /// As written in gateway.toml; `<agent>/<id>` for an agent file's.
    id: Arc<str>,
    effect: Effect,
    /// Names of the agents it applies to; empty: all.
    agents: Vec<String>,
    when: expr::Compiled,
    /// Whether its evaluation failing has been logged (once per rule per configuration).
    logged: AtomicBool,
}

impl Rule {
    fn applies_to(&self, agent: &str) -> bool {
        self.agents.is_empty() || self.agents.iter().any(|a| a == agent)
    }
}

/// A refusal: the rule that refused, or [`NO_ALLOW_MATCHED`].
#[derive(Debug)]
pub(crate) struct Denial {
    pub(crate) rule: Arc<str>,
}

/// The rule a refusal names when allow rules apply and none held. Not a valid rule id,
/// so it never names one.
pub(crate) const NO_ALLOW_MATCHED: &str = "(no allow rule matched)";

/// Every rule of a configuration.
pub(crate) struct Policies {
    rules: Vec<Rule>,
    env: Arc<cel::Env>,
    reads_skill: bool,
    headers: Vec<String>,
    /// What `check` and a load warn about: rules that likely do not mean what they say.
    warnings: Vec<PolicyError>,
}

impl Default for Policies {
    fn default() -> Policies {
        Policies {
            rules: Vec::new(),
            env: Arc::new(cel::Env::stdlib()),
            reads_skill: false,
            headers: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

impl Policies {
    /// Compiles the gateway file's rules and every agent's.
    pub(crate) fn build(
        gateway_file: &std::path::Path,
        gateway: &[PolicyConfig],
        agents: &[AgentDef],
    ) -> Result<Policies, Vec<PolicyError>> {
        let mut policies = Policies::default();
        let mut errors = Vec::new();
        let all =
            (gateway.iter().map(|p| (gateway_file, None, p))).chain(agents.iter().flat_map(|a| {
                let source = a.source.as_path();
                a.policies
                    .iter()
                    .map(move |p| (source, Some(a.name.as_str()), p))
            }));
        for (file, agent, p) in all {
            match expr::compile(p.when.get_ref()) {
                Ok(mut when) => {
                    for w in std::mem::take(&mut when.warnings) {
                        policies.warnings.push(PolicyError {
                            file: file.to_path_buf(),
                            when_at: p.when.span().start,
                            offset: w.offset,
                            message: format!("policy \"{}\": {}", p.id, w.message),
                        });
                    }
                    policies.reads_skill |= when.reads.skill;
                    for h in &when.reads.headers {
                        if !policies.headers.contains(h) {
                            policies.headers.push(h.clone());
                        }
                    }
                    policies.rules.push(Rule {
                        id: match agent {
                            Some(agent) => Arc::from(format!("{agent}/{}", p.id)),
                            None => Arc::from(p.id.as_str()),
                        },
                        effect: p.effect,
                        agents: match agent {
                            Some(agent) => vec![agent.to_string()],
                            None => p.agents.clone(),
                        },
                        when,
                        logged: AtomicBool::new(false),
                    })
                }
                Err(e) => errors.push(PolicyError {
                    file: file.to_path_buf(),
                    when_at: p.when.span().start,
                    offset: e.offset,
                    message: format!("policy \"{}\": {}", p.id, e.message),
                }),
            }
        }
        // Deny rules are read first: any that holds refuses.
        policies.rules.sort_by_key(|r| r.effect != Effect::Deny);
        match errors.is_empty() {
            true => Ok(policies),
            false => Err(errors),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Rules that compile but likely do not mean what they say.
    pub(crate) fn warnings(&self) -> &[PolicyError] {
        &self.warnings
    }

    /// Whether a rule for `agent` reads `a2a.skill` (read from the request's body only
    /// then).
    pub(crate) fn reads_skill(&self, agent: &str) -> bool {
        self.reads_skill && (self.rules.iter()).any(|r| r.when.reads.skill && r.applies_to(agent))
    }

    /// The headers the rules read, lowercase.
    pub(crate) fn headers(&self) -> &[String] {
        &self.headers
    }

    /// Whether `facts` may pass.
    pub(crate) fn decide(&self, facts: &Facts<'_>) -> Result<(), Denial> {
        let mut allow_applies = false;
        for rule in self.rules.iter().filter(|r| r.applies_to(facts.agent_name)) {
            let holds = match rule.when.holds(&self.env, facts) {
                Ok(holds) => holds,
                Err(error) => {
                    if !rule.logged.swap(true, Ordering::Relaxed) {
                        tracing::warn!(rule = %rule.id, %error, "a policy could not be evaluated; it denies (logged once per rule)");
                    }
                    // Failing denies: as a deny rule that held, or an allow rule that did not.
                    rule.effect == Effect::Deny
                }
            };
            match rule.effect {
                Effect::Deny if holds => {
                    return Err(Denial {
                        rule: rule.id.clone(),
                    })
                }
                Effect::Deny => {}
                Effect::Allow if holds => return Ok(()),
                Effect::Allow => allow_applies = true,
            }
        }
        match allow_applies {
            true => Err(Denial {
                rule: Arc::from(NO_ALLOW_MATCHED),
            }),
            false => Ok(()),
        }
    }
}
