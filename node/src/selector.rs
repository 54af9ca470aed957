//! Kubernetes-style label selectors (`matchLabels`, `matchExpressions`) for
//! the config file's per-node overrides.

use std::collections::BTreeMap;

use serde::Deserialize;

/// A validation error inside a selector; `field` is relative to the selector
/// (`.matchExpressions[0].operator`), the config module prefixes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct SelectorError {
    pub field: String,
    pub reason: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> SelectorError {
    SelectorError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// One requirement on a label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Self::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Self::Exists(k) => labels.contains_key(k),
            Self::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A validated selector: every label and every requirement must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// True when `labels` satisfy every part of the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.requirements.iter().all(|r| r.matches(labels))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawSelector {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
    #[serde(default)]
    match_expressions: Vec<RawExpression>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpression {
    key: String,
    operator: String,
    #[serde(default)]
    values: Option<Vec<String>>,
}

impl RawSelector {
    pub(crate) fn validate(self) -> Result<LabelSelector, SelectorError> {
        if self.match_labels.is_empty() && self.match_expressions.is_empty() {
            return Err(err(
                "",
                "selects nothing: give matchLabels or matchExpressions",
            ));
        }
        if self.match_labels.keys().any(|k| k.trim().is_empty()) {
            return Err(err(".matchLabels", "a label key must not be empty"));
        }
        let mut requirements = Vec::with_capacity(self.match_expressions.len());
        for (i, e) in self.match_expressions.into_iter().enumerate() {
            let field = format!(".matchExpressions[{i}]");
            if e.key.trim().is_empty() {
                return Err(err(format!("{field}.key"), "must not be empty"));
            }
            let values = e.values.unwrap_or_default();
            let r = match e.operator.as_str() {
                op @ ("In" | "NotIn") => {
                    if values.is_empty() {
                        return Err(err(
                            format!("{field}.values"),
                            format!("{op} needs at least one value"),
                        ));
                    }
                    if op == "In" {
                        Requirement::In(e.key, values)
                    } else {
                        Requirement::NotIn(e.key, values)
                    }
                }
                op @ ("Exists" | "DoesNotExist") => {
                    if !values.is_empty() {
                        return Err(err(
                            format!("{field}.values"),
                            format!("{op} takes no values"),
                        ));
                    }
                    if op == "Exists" {
                        Requirement::Exists(e.key)
                    } else {
                        Requirement::DoesNotExist(e.key)
                    }
                }
                other => {
                    return Err(err(
                        format!("{field}.operator"),
                        format!(
                            "unknown operator {other:?}; expected In, NotIn, Exists or DoesNotExist"
                        ),
                    ));
                }
            };
            requirements.push(r);
        }
        Ok(LabelSelector {
            match_labels: self.match_labels,
            requirements,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(yaml: &str) -> LabelSelector {
        let raw: RawSelector = tessera_contract::yaml::from_yaml(yaml)
            .expect("yaml")
            .expect("a selector");
        raw.validate().expect("valid")
    }

    #[test]
    fn operators() {
        let s = sel("matchExpressions: [{key: a, operator: In, values: [x, y]}]");
        assert!(s.matches(&labels(&[("a", "y")])));
        assert!(!s.matches(&labels(&[("a", "z")])));
        assert!(!s.matches(&labels(&[])));

        let s = sel("matchExpressions: [{key: a, operator: NotIn, values: [x]}]");
        assert!(s.matches(&labels(&[("a", "y")])));
        assert!(s.matches(&labels(&[])), "NotIn matches an absent label");
        assert!(!s.matches(&labels(&[("a", "x")])));

        let s = sel("matchExpressions: [{key: a, operator: Exists}]");
        assert!(s.matches(&labels(&[("a", "")])));
        assert!(!s.matches(&labels(&[("b", "")])));

        let s = sel("matchExpressions: [{key: a, operator: DoesNotExist}]");
        assert!(!s.matches(&labels(&[("a", "")])));
        assert!(s.matches(&labels(&[("b", "")])));
    }

    #[test]
    fn labels_and_expressions_must_all_match() {
        let s = sel(
            "matchLabels: {pool: gpu}\nmatchExpressions: [{key: zone, operator: In, values: [z1]}]",
        );
        assert!(s.matches(&labels(&[("pool", "gpu"), ("zone", "z1")])));
        assert!(!s.matches(&labels(&[("pool", "gpu"), ("zone", "z2")])));
        assert!(!s.matches(&labels(&[("pool", "cpu"), ("zone", "z1")])));
    }
}
