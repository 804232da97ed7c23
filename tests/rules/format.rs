//! One rules document in TOML, JSON and YAML; hostile values in each.

use tower_sliding_window::rules::{Rules, RulesErrorKind, MAX_LIMIT};
use tower_sliding_window::{PathKey, SlidingWindowLayer};

const TOML: &str = r#"
default = 100

[limits]
"/login" = 5
"/search" = 20
"#;

const JSON: &str = r#"{ "default": 100, "limits": { "/login": 5, "/search": 20 } }"#;

const YAML: &str = "
default: 100
limits:
  /login: 5
  /search: 20
";

fn expected() -> Rules {
    Rules::new()
        .default_limit(100)
        .limit("/login", 5)
        .limit("/search", 20)
}

fn from_toml(text: &str) -> Result<Rules, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

fn from_json(text: &str) -> Result<Rules, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

fn from_yaml(text: &str) -> Result<Rules, String> {
    serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
}

#[test]
fn the_same_document_reads_alike_in_toml_json_and_yaml() {
    assert_eq!(from_toml(TOML), Ok(expected()));
    assert_eq!(from_json(JSON), Ok(expected()));
    assert_eq!(from_yaml(YAML), Ok(expected()));
}

#[test]
fn a_document_round_trips_through_each_format() {
    let rules = expected();
    let toml_text = toml::to_string(&rules).unwrap();
    assert_eq!(from_toml(&toml_text), Ok(rules.clone()), "{toml_text}");
    let json_text = serde_json::to_string(&rules).unwrap();
    assert_eq!(from_json(&json_text), Ok(rules.clone()), "{json_text}");
    let yaml_text = serde_yaml_ng::to_string(&rules).unwrap();
    assert_eq!(from_yaml(&yaml_text), Ok(rules.clone()), "{yaml_text}");

    // Absent fields are left out, and read back as absent.
    let empty = Rules::new();
    assert_eq!(serde_json::to_string(&empty).unwrap(), "{}");
    assert_eq!(from_toml(""), Ok(empty.clone()));
    assert_eq!(from_json("{}"), Ok(empty.clone()));
    assert_eq!(from_yaml("{}"), Ok(empty));
}

#[test]
fn an_unknown_field_is_an_error_naming_it_in_every_format() {
    for err in [
        from_toml("defualt = 5\n").unwrap_err(),
        from_json(r#"{ "defualt": 5 }"#).unwrap_err(),
        from_yaml("defualt: 5\n").unwrap_err(),
    ] {
        assert!(err.contains("unknown field `defualt`"), "{err}");
    }
    // Also a misspelt table name.
    let err = from_toml("[limit]\n\"/a\" = 1\n").unwrap_err();
    assert!(err.contains("unknown field `limit`"), "{err}");
}

#[test]
fn hostile_values_are_refused_when_read() {
    let cases: [(&str, &str, &str); 6] = [
        ("negative", "default = -1", r#"{ "default": -1 }"#),
        (
            "2^64",
            "default = 18446744073709551616",
            r#"{ "default": 18446744073709551616 }"#,
        ),
        ("1e30", "default = 1e30", r#"{ "default": 1e30 }"#),
        ("fraction", "default = 1.5", r#"{ "default": 1.5 }"#),
        ("NaN text", r#"default = "NaN""#, r#"{ "default": "NaN" }"#),
        ("NaN", "default = nan", r#"{ "default": NaN }"#),
    ];
    for (what, toml_text, json_text) in cases {
        assert!(
            from_toml(toml_text).is_err(),
            "{what}: TOML read {toml_text}"
        );
        assert!(
            from_json(json_text).is_err(),
            "{what}: JSON read {json_text}"
        );
        let yaml_text = json_text; // JSON is YAML
        assert!(
            from_yaml(yaml_text).is_err(),
            "{what}: YAML read {yaml_text}"
        );
    }
    // The same in a per-key limit.
    assert!(from_toml("[limits]\n\"/a\" = -3\n").is_err());
    assert!(from_json(r#"{ "limits": { "/a": "5" } }"#).is_err());
    assert!(from_yaml("limits:\n  /a: .nan\n").is_err());
    // Bytes that are not UTF-8.
    assert!(serde_json::from_slice::<Rules>(b"{ \"limits\": { \"/\xff\": 1 } }").is_err());
}

#[test]
fn a_limit_that_reads_but_is_out_of_range_is_refused_when_applied() {
    let stats = SlidingWindowLayer::qps(10).key(PathKey).handle();
    let rules = from_toml("[limits]\n\"/a\" = 18446744073709551615\n").unwrap();
    let err = stats.apply_rules(&rules).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            r#"rules: limits["/a"]: limit must be at most {MAX_LIMIT} (got 18446744073709551615)"#
        )
    );
    assert_eq!(err.kind(), RulesErrorKind::Invalid);
    // The largest limit is accepted.
    let rules = from_json(&format!(r#"{{ "default": {MAX_LIMIT} }}"#)).unwrap();
    assert_eq!(stats.apply_rules(&rules), Ok(1));
}

#[test]
fn a_very_long_key_is_refused_with_a_short_message() {
    let stats = SlidingWindowLayer::qps(10).key(PathKey).handle();
    let key = format!("/{}", "a".repeat(1 << 20));
    let json = serde_json::to_string(&serde_json::json!({ "limits": { key.clone(): 1 } })).unwrap();
    let rules = from_json(&json).unwrap();
    let err = stats.apply_rules(&rules).unwrap_err();
    assert_eq!(err.field(), Some("key"));
    assert_eq!(
        err.to_string(),
        format!(
            "rules: limits[\"/{}…\"]: key must be at most 256 bytes, as a longer one is keyed \
             by its digest (got {} bytes)",
            "a".repeat(63),
            key.len()
        )
    );
}
