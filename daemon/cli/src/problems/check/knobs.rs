//! Knob and idea annotations: the SDK's grammar (`kiln_sdk::knobs::parse`), and two rules
//! of this suite on top: a knob's value in the source is one of its listed values (so a
//! proposer can always return to it), and a knob with a launch binding agrees with the
//! launch plan at that value (`problem.toml` holds the plan for the knobs' defaults).

use kiln_sdk::knobs::{self, Knob};
use kiln_types::Launch;

use super::Issue;

/// Triton's defaults for the launch options a plan leaves out.
const DEFAULT_NUM_WARPS: u32 = 4;
const DEFAULT_NUM_STAGES: u32 = 3;

/// `launches` with Triton's defaults written out, so that a plan that leaves `num_warps`
/// out equals one that gives 4.
fn with_defaults(launches: &[Launch], triton: bool) -> Vec<Launch> {
    let mut out = launches.to_vec();
    if triton {
        for l in &mut out {
            l.num_warps.get_or_insert(DEFAULT_NUM_WARPS);
            l.num_stages.get_or_insert(DEFAULT_NUM_STAGES);
        }
    }
    out
}

/// The binding of `knob` applied at its own value, against the plan: what differs.
fn binding_mismatch(knob: &Knob, launches: &[Launch], triton: bool) -> Option<String> {
    let binding = knob.launch.as_ref()?;
    let plan = with_defaults(launches, triton);
    let mut moved = plan.clone();
    if let Err(e) = binding.apply(&mut moved, &knob.current) {
        return Some(format!("knob {}: {e}", knob.name));
    }
    let moved = with_defaults(&moved, triton);
    let (i, (was, now)) = plan
        .iter()
        .zip(&moved)
        .enumerate()
        .find(|(_, (a, b))| a != b)?;
    let field = if was.block != now.block {
        format!("block {:?}", was.block)
    } else if was.grid != now.grid {
        format!("grid {:?}", was.grid)
    } else if was.num_warps != now.num_warps {
        format!("num_warps = {}", was.num_warps.unwrap_or(DEFAULT_NUM_WARPS))
    } else if was.num_stages != now.num_stages {
        format!(
            "num_stages = {}",
            was.num_stages.unwrap_or(DEFAULT_NUM_STAGES)
        )
    } else {
        format!("constexprs {:?}", was.constexprs)
    };
    let triton_only = !triton
        && (now.num_warps.is_some() || now.num_stages.is_some() || !now.constexprs.is_empty());
    Some(if triton_only {
        format!(
            "knob {} binds a field only Triton launches have (num_warps, num_stages, \
             constexprs)",
            knob.name
        )
    } else {
        format!(
            "launches[{i}] ({}) has {field}, but knob {} (bound to it) is {} in the source",
            was.kernel, knob.name, knob.current
        )
    })
}

/// Everything wrong with the annotations of `source`, whose launch plan is `launches`.
pub fn check(source: &str, launches: &[Launch], triton: bool) -> Vec<Issue> {
    let notes = match knobs::parse(source) {
        Ok(n) => n,
        Err(e) => return vec![Issue::from_prefixed(&e.to_string())],
    };
    let mut out = Vec::new();
    for k in &notes.knobs {
        if k.current_index.is_none() {
            out.push(Issue::at(
                k.line,
                format!(
                    "knob {}'s value {:?} is not one of its values {:?}",
                    k.name, k.current, k.values
                ),
            ));
        }
        if let Some(m) = binding_mismatch(k, launches, triton) {
            out.push(Issue::at(k.line, m));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launches(json: &str) -> Vec<Launch> {
        serde_json::from_str(json).expect("launches")
    }

    #[test]
    fn defaults_must_be_listed_and_agree_with_bound_launch_fields() {
        let plan =
            launches(r#"[{"kernel":"k","block":[256,1,1]},{"kernel":"other","block":[64,1,1]}]"#);
        let src = "// @knob BLOCK 128|256 launch:block.x@k\n#define BLOCK 256\n";
        assert_eq!(check(src, &plan, false), Vec::new());
        let got = check(
            "// @knob BLOCK 128|256 launch:block.x@k\n#define BLOCK 128\n",
            &plan,
            false,
        );
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].line, Some(2));
        assert!(
            got[0].message.contains(
                "launches[0] (k) has block [256, 1, 1], but knob BLOCK (bound to it) is 128"
            ),
            "{got:?}"
        );
        let got = check("// @knob BLOCK 128|512\n#define BLOCK 256\n", &plan, false);
        assert!(
            got[0]
                .message
                .contains("value \"256\" is not one of its values"),
            "{got:?}"
        );
        let got = check(
            "// @knob WARPS 4|8 launch:num_warps\n#define WARPS 4\n",
            &plan,
            false,
        );
        assert!(
            got[0].message.contains("only Triton launches have"),
            "{got:?}"
        );
    }

    #[test]
    fn triton_options_compare_with_their_defaults() {
        let plan = launches(r#"[{"kernel":"softmax_rows","num_warps":8}]"#);
        let src = "# @knob WARPS 4|8 launch:num_warps@softmax_rows\nWARPS = tl.constexpr(8)\n";
        assert_eq!(check(src, &plan, true), Vec::new());
        let got = check(&src.replace("(8)", "(4)"), &plan, true);
        assert!(
            got[0]
                .message
                .contains("has num_warps = 8, but knob WARPS (bound to it) is 4"),
            "{got:?}"
        );
        // Left out means Triton's default, 4 warps and 3 stages.
        let plan = launches(r#"[{"kernel":"k"}]"#);
        let src = "# @knob S 2|3 launch:num_stages\nS = tl.constexpr(3)\n";
        assert_eq!(check(src, &plan, true), Vec::new());
        let got = check(&src.replace("(3)", "(2)"), &plan, true);
        assert!(got[0].message.contains("num_stages = 3"), "{got:?}");
    }

    #[test]
    fn grammar_errors_come_from_the_sdk_with_their_line() {
        let got = check("int x;\n// @knobs BLOCK 1|2\n#define BLOCK 1\n", &[], false);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].line, Some(2));
        assert!(
            got[0].message.contains("unknown annotation `@knobs`"),
            "{got:?}"
        );
        let got = check("// @knob BLOCK 1|2\n\n#define BLOCK 1\n", &[], false);
        assert!(
            got[0].message.contains("must be directly followed"),
            "{got:?}"
        );
    }
}
